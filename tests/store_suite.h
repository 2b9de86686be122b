// The conformance suite every ChunkStore backend passes. A test file that
// includes this defines OpenConformanceStore (a fresh, empty store for the
// named backend, or nullptr after GTEST_SKIP) and instantiates the suite:
//   INSTANTIATE_TEST_SUITE_P(File, StoreConformance, ::testing::Values("file"));
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cachegen/store.h"

namespace cachegen::testing_store {

std::unique_ptr<ChunkStore> OpenConformanceStore(const std::string& backend);

inline ChunkKey RandomKey(std::mt19937_64& rng) {
  ChunkKey k;
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

inline ChunkKey KeyOf(uint64_t a, uint64_t b = 0) {
  ChunkKey k;
  std::memcpy(k.bytes.data(), &a, 8);
  std::memcpy(k.bytes.data() + 8, &b, 8);
  return k;
}

// A frame whose bytes say what it is: 16-byte header (tag, length) then a
// pattern derived from the tag, so a reader can tell a whole frame from a
// mixed or truncated one.
inline std::vector<uint8_t> TaggedFrame(uint64_t tag, size_t size) {
  size = std::max<size_t>(size, 16);
  std::vector<uint8_t> f;
  f.reserve(size);
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(tag >> (8 * i)));
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(uint64_t{size} >> (8 * i)));
  for (size_t i = 16; i < size; ++i) f.push_back(static_cast<uint8_t>(tag * 131 + i * 7));
  return f;
}
// The tag of a well-formed tagged frame, or -1.
inline int64_t FrameTag(const std::vector<uint8_t>& f) {
  if (f.size() < 16) return -1;
  uint64_t tag, len;
  std::memcpy(&tag, f.data(), 8);
  std::memcpy(&len, f.data() + 8, 8);
  if (len != f.size()) return -1;
  for (size_t i = 16; i < f.size(); ++i)
    if (f[i] != static_cast<uint8_t>(tag * 131 + i * 7)) return -1;
  return static_cast<int64_t>(tag);
}

// The directories FreshTempDir made, removed when the test process exits
// (every run of a store test used to leave a dozen behind). Only by the
// process that made them: a forked writer that exited normally would
// otherwise remove its parent's directories while the parent still tests them.
class TempDirRegistry {
 public:
  static void Add(const std::string& dir) {
    static TempDirRegistry registry;
    std::lock_guard<std::mutex> lock(registry.mu_);
    registry.dirs_.push_back(dir);
  }
  ~TempDirRegistry() {
    if (::getpid() != owner_) return;
    std::error_code ec;  // best effort: a leftover is litter, not a failure
    for (const std::string& dir : dirs_) std::filesystem::remove_all(dir, ec);
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

inline std::string FreshTempDir(const std::string& name) {
  static std::atomic<int> seq{0};
  const std::string dir = ::testing::TempDir() + "/cachegen_store_" + std::to_string(::getpid()) + "_" +
                          std::to_string(seq++) + "_" + name;
  std::filesystem::remove_all(dir);
  TempDirRegistry::Add(dir);
  return dir;
}

class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    store_ = OpenConformanceStore(GetParam());
    if (!store_ && !IsSkipped()) FAIL() << "could not open a " << GetParam() << " store";
    rng_.seed(std::hash<std::string>()(::testing::UnitTest::GetInstance()->current_test_info()->name()) ^
              static_cast<uint64_t>(::getpid()));
  }
  std::unique_ptr<ChunkStore> store_;
  std::mt19937_64 rng_;
};

TEST_P(StoreConformance, PutGetSizeRoundTrip) {
  const ChunkKey k = RandomKey(rng_);
  const auto frame = TaggedFrame(7, 3000);
  ASSERT_TRUE(store_->Put(k, 0, frame).ok());
  auto got = store_->Get(k, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, frame);
  auto size = store_->Size(k, 0);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, frame.size());
  const StoreStats s = store_->stats();
  EXPECT_EQ(s.puts, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.bytes_written, frame.size());
  EXPECT_EQ(s.bytes_read, frame.size());
  EXPECT_EQ(store_->uri().rfind(GetParam() == "file" ? "file://" : GetParam(), 0), 0u) << store_->uri();
}

TEST_P(StoreConformance, MissingIsNotFoundAndCounted) {
  const ChunkKey k = RandomKey(rng_);
  auto got = store_->Get(k, 3);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_EQ(store_->Size(k, 3).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Delete(k, 3).ok());
  EXPECT_EQ(store_->stats().misses, 1u);
  EXPECT_EQ(store_->stats().corrupt, 0u);
}

TEST_P(StoreConformance, LevelsAreSeparateEntries) {
  const ChunkKey k = RandomKey(rng_);
  for (uint32_t level = 0; level < 4; ++level) ASSERT_TRUE(store_->Put(k, level, TaggedFrame(level, 100 + level)).ok());
  ASSERT_TRUE(store_->Delete(k, 2).ok());
  for (uint32_t level = 0; level < 4; ++level) {
    auto got = store_->Get(k, level);
    if (level == 2) {
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(FrameTag(*got), level);
    EXPECT_EQ(got->size(), 100 + level);
  }
  // Another key with the same level is another entry too.
  EXPECT_EQ(store_->Get(RandomKey(rng_), 0).status().code(), StatusCode::kNotFound);
}

TEST_P(StoreConformance, PutReplacesAndDeleteRemoves) {
  const ChunkKey k = RandomKey(rng_);
  ASSERT_TRUE(store_->Put(k, 1, TaggedFrame(1, 5000)).ok());
  ASSERT_TRUE(store_->Put(k, 1, TaggedFrame(2, 40)).ok());
  auto got = store_->Get(k, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(FrameTag(*got), 2);
  EXPECT_EQ(*store_->Size(k, 1), 40u);
  ASSERT_TRUE(store_->Delete(k, 1).ok());
  EXPECT_EQ(store_->Get(k, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Size(k, 1).status().code(), StatusCode::kNotFound);
}

TEST_P(StoreConformance, EmptyAndLargeFrames) {
  const ChunkKey k = RandomKey(rng_);
  ASSERT_TRUE(store_->Put(k, 0, {}).ok());
  auto empty = store_->Get(k, 0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(*store_->Size(k, 0), 0u);
  const auto big = TaggedFrame(9, 3u << 20);
  ASSERT_TRUE(store_->Put(k, 1, big).ok());
  auto got = store_->Get(k, 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == big);
}

// Threads overwrite and read a few shared entries: every read returns one
// whole frame that was written for that address, never a mix.
TEST_P(StoreConformance, ConcurrentThreadsSeeWholeFrames) {
  constexpr int kThreads = 8, kOps = 150, kKeys = 6;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(RandomKey(rng_));
  std::atomic<int> bad{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 r(t);
      for (int op = 0; op < kOps; ++op) {
        const int ki = static_cast<int>(r() % kKeys);
        if (r() % 2) {
          // tag = key index + 16 * writer: the key index is recoverable.
          const uint64_t tag = static_cast<uint64_t>(ki) + 16 * static_cast<uint64_t>(t * kOps + op);
          if (!store_->Put(keys[ki], 0, TaggedFrame(tag, 64 + r() % 20000)).ok()) ++bad;
        } else {
          auto got = store_->Get(keys[ki], 0);
          if (got.ok()) {
            ++hits;
            const int64_t tag = FrameTag(*got);
            if (tag < 0 || tag % 16 != ki) ++bad;
          } else if (got.status().code() != StatusCode::kNotFound) {
            ++bad;
          }
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(store_->stats().corrupt, 0u);
}

}  // namespace cachegen::testing_store
