// Chunk store: keys, records, URIs, the mem:// and file:// backends (the
// shared conformance suite plus on-disk corruption, crash, multi-process
// and LRU-budget tests).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "store/file_store.h"
#include "store/record.h"
#include "store/uri.h"
#include "store_suite.h"

namespace cachegen::testing_store {

std::unique_ptr<ChunkStore> OpenConformanceStore(const std::string& backend) {
  const std::string uri = backend == "file" ? "file://" + FreshTempDir("conf") : "mem://";
  auto s = OpenStore(uri);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreConformance, ::testing::Values("mem", "file"));

namespace {

using store::FileStore;

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::unique_ptr<ChunkStore> MustOpen(const std::string& uri) {
  auto s = OpenStore(uri);
  EXPECT_TRUE(s.ok()) << uri << ": " << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

std::string ChunkPath(const std::string& root, const ChunkKey& k, uint32_t level) {
  return root + "/" + k.Hex().substr(0, 2) + "/" + k.Hex() + "." + std::to_string(level);
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Every chunk file under root verifies, and no temp file is left.
void ExpectAllVerify(const std::string& root, size_t* count = nullptr) {
  auto fs = FileStore::Open(root, 0, "file://" + root);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto scan = (*fs)->Scan(false);
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->temp_files, 0u);
  for (const auto& e : scan->entries) EXPECT_TRUE((*fs)->VerifyEntry(e).ok()) << e.path;
  if (count) *count = scan->entries.size();
}

TEST(ChunkKey, HexRoundTrip) {
  ChunkKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(i * 17 + 3);
  const std::string hex = k.Hex();
  EXPECT_EQ(hex, "031425364758697a8b9cadbecfe0f102");
  auto back = ChunkKey::FromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  auto upper = ChunkKey::FromHex("031425364758697A8B9CADBECFE0F102");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(*upper, k);
}

TEST(ChunkKey, FromHexRejectsMalformed) {
  for (const char* bad : {"", "0314", "031425364758697a8b9cadbecfe0f1020", "031425364758697a8b9cadbecfe0f10",
                          "g31425364758697a8b9cadbecfe0f102", "031425364758697a8b9cadbecfe0f1 2",
                          "0x1425364758697a8b9cadbecfe0f102"}) {
    auto r = ChunkKey::FromHex(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(StoreRecord, RoundTripAndAddress) {
  const ChunkKey k = KeyOf(1, 2);
  const auto frame = TaggedFrame(5, 100);
  const auto rec = store::EncodeRecord(k, 3, frame);
  ASSERT_EQ(rec.size(), store::kRecordHeaderSize + frame.size());
  auto payload = store::OpenRecord(rec, k, 3);
  ASSERT_TRUE(payload.ok()) << payload.status().ToString();
  EXPECT_TRUE(std::equal(payload->begin(), payload->end(), frame.begin(), frame.end()));
  auto h = store::VerifyRecord(rec);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->key, k);
  EXPECT_EQ(h->level, 3u);
  EXPECT_EQ(h->length, frame.size());
  // Stored under another address: misplaced.
  EXPECT_EQ(store::OpenRecord(rec, KeyOf(1, 3), 3).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(store::OpenRecord(rec, k, 2).status().code(), StatusCode::kCorrupt);
}

TEST(StoreRecord, EveryFlippedByteAndEveryTruncationIsCaught) {
  const ChunkKey k = KeyOf(0x1234, 0x5678);
  const auto rec = store::EncodeRecord(k, 1, TaggedFrame(3, 64));
  for (size_t i = 0; i < rec.size(); ++i) {
    for (uint8_t mask : {uint8_t{1}, uint8_t{0x80}}) {
      auto bad = rec;
      bad[i] ^= mask;
      EXPECT_FALSE(store::OpenRecord(bad, k, 1).ok()) << "flip at byte " << i;
    }
  }
  for (size_t n = 0; n < rec.size(); ++n)
    EXPECT_FALSE(store::OpenRecord(std::span(rec).first(n), k, 1).ok()) << "truncated to " << n;
  auto longer = rec;
  longer.push_back(0);
  EXPECT_FALSE(store::OpenRecord(longer, k, 1).ok());
}

TEST(StoreUri, ParsesParts) {
  auto u = store::ParseStoreUri("Redis-Cluster://:secret@h1:7000,h2:7001?ttl=60&timeout_ms=50");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->scheme, "redis-cluster");
  EXPECT_EQ(u->userinfo, ":secret");
  EXPECT_EQ(u->authority, "h1:7000,h2:7001");
  EXPECT_EQ(u->Redacted(), "Redis-Cluster://***@h1:7000,h2:7001?ttl=60&timeout_ms=50");
  EXPECT_EQ(*u->TakeUInt("ttl", 0), 60u);
  EXPECT_FALSE(u->CheckNoneLeft().ok());  // timeout_ms not taken
  EXPECT_EQ(*u->TakeUInt("timeout_ms", 0), 50u);
  EXPECT_TRUE(u->CheckNoneLeft().ok());
  auto hosts = store::ParseHostList(u->authority, 6379);
  ASSERT_TRUE(hosts.ok());
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ((*hosts)[1].host, "h2");
  EXPECT_EQ((*hosts)[1].port, 7001);
  auto v6 = store::ParseHostList("[::1]:7002,localhost", 6379);
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ((*v6)[0].host, "::1");
  EXPECT_EQ((*v6)[0].port, 7002);
  EXPECT_EQ((*v6)[1].port, 6379);
  for (const char* bad : {"", ",", "h:0", "h:65536", "h:x", ":7000", "[::1", "h:"})
    EXPECT_FALSE(store::ParseHostList(bad, 6379).ok()) << bad;
  auto f = store::ParseStoreUri("file:///a/b?max_bytes=2M");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->path, "/a/b");
  EXPECT_EQ(*f->TakeSize("max_bytes", 0), 2u << 20);
}

TEST(OpenStore, RejectsMalformedUris) {
  for (const char* bad :
       {"", "file", "/tmp/x", "://x", "ftp://x", "file://relative/path", "file://", "file:///x?max_bytes=abc",
        "file:///x?max_bytes=-1", "file:///x?max_bytes=1Q", "file:///x?bogus=1", "file:///x?max_bytes=1&max_bytes=2",
        "file:///x?novalue", "mem://host", "mem:///path", "mem://?max_bytes=99999999999999999999",
        "mem://?max_bytes=99999999999999T"}) {
    auto s = OpenStore(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status().ToString();
  }
}

TEST(MemStore, LruEvictsLeastRecentlyUsed) {
  const uint64_t rec = store::kRecordHeaderSize + 1000;
  auto s = MustOpen("mem://?max_bytes=" + std::to_string(3 * rec));
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(s->Put(KeyOf(i), 0, TaggedFrame(i, 1000)).ok());
  ASSERT_TRUE(s->Get(KeyOf(0), 0).ok());                      // 0 is now the most recent
  ASSERT_TRUE(s->Put(KeyOf(3), 0, TaggedFrame(3, 1000)).ok());  // evicts 1
  EXPECT_TRUE(s->Get(KeyOf(0), 0).ok());
  EXPECT_EQ(s->Get(KeyOf(1), 0).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(s->Get(KeyOf(2), 0).ok());
  EXPECT_TRUE(s->Get(KeyOf(3), 0).ok());
  EXPECT_EQ(s->stats().evictions, 1u);
  auto too_big = s->Put(KeyOf(9), 0, TaggedFrame(9, 4 * 1000));
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
}

TEST(FileStore, LayoutIsOneVerifiedFilePerChunkLevel) {
  const std::string root = FreshTempDir("layout");
  auto s = MustOpen("file://" + root);
  const ChunkKey k = KeyOf(0xabcdef, 42);
  ASSERT_TRUE(s->Put(k, 2, TaggedFrame(1, 500)).ok());
  const auto bytes = ReadFile(ChunkPath(root, k, 2));
  ASSERT_EQ(bytes.size(), store::kRecordHeaderSize + 500);
  EXPECT_TRUE(store::OpenRecord(bytes, k, 2).ok());
  EXPECT_EQ(s->uri(), "file://" + root);
}

TEST(FileStore, CorruptTruncatedOrMisplacedFileIsACountedMiss) {
  const std::string root = FreshTempDir("corrupt");
  auto s = MustOpen("file://" + root);
  const ChunkKey a = KeyOf(1), b = KeyOf(2), c = KeyOf(3);
  for (const ChunkKey& k : {a, b, c}) ASSERT_TRUE(s->Put(k, 0, TaggedFrame(k.bytes[0], 4000)).ok());

  auto bytes = ReadFile(ChunkPath(root, a, 0));
  bytes[store::kRecordHeaderSize + 1234] ^= 0x10;  // one bit of the payload
  WriteFile(ChunkPath(root, a, 0), bytes);
  auto got = s->Get(a, 0);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("checksum"), std::string::npos) << got.status().message();
  EXPECT_EQ(s->stats().corrupt, 1u);
  // The read removed it: a HEAD or lookup (Size) no longer lists it.
  EXPECT_EQ(s->Size(a, 0).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(ChunkPath(root, a, 0)));

  bytes = ReadFile(ChunkPath(root, b, 0));
  bytes.resize(bytes.size() - 100);  // torn tail
  WriteFile(ChunkPath(root, b, 0), bytes);
  EXPECT_EQ(s->Get(b, 0).status().code(), StatusCode::kNotFound);
  bytes.resize(10);  // torn header
  WriteFile(ChunkPath(root, b, 0), bytes);
  EXPECT_EQ(s->Get(b, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->stats().corrupt, 3u);

  // c's valid record copied over a's name: verifies, but is misplaced.
  WriteFile(ChunkPath(root, a, 0), ReadFile(ChunkPath(root, c, 0)));
  got = s->Get(a, 0);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("misplaced"), std::string::npos) << got.status().message();
  EXPECT_EQ(s->stats().corrupt, 4u);
  EXPECT_EQ(s->stats().misses, 4u);
  EXPECT_TRUE(s->Get(c, 0).ok());
  // A new Put repairs the entry.
  ASSERT_TRUE(s->Put(a, 0, TaggedFrame(1, 4000)).ok());
  EXPECT_TRUE(s->Get(a, 0).ok());
}

TEST(FileStore, StaleTempFilesAreRemovedOnOpen) {
  const std::string root = FreshTempDir("temps");
  { ASSERT_NE(MustOpen("file://" + root), nullptr); }
  std::filesystem::create_directories(root + "/ab");
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const std::string stale = root + "/ab/.tmp-" + std::to_string(dead) + "-0-x";
  const std::string live = root + "/ab/.tmp-" + std::to_string(getpid()) + "-0-x";
  const std::string unrelated = root + "/ab/notes.txt";
  for (const auto& p : {stale, live, unrelated}) WriteFile(p, {1, 2, 3});
  auto s = MustOpen("file://" + root);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));  // its writer may still finish
  EXPECT_TRUE(std::filesystem::exists(unrelated));
}

TEST(FileStore, BudgetEvictsLeastRecentlyUsed) {
  const std::string root = FreshTempDir("lru");
  const uint64_t rec = store::kRecordHeaderSize + 1000;
  // Room for 5 records; eviction goes down to 90% of the budget.
  auto s = MustOpen("file://" + root + "?max_bytes=" + std::to_string(5 * rec + 100));
  for (uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(s->Put(KeyOf(i), 0, TaggedFrame(i, 1000)).ok());
    SleepMs(15);  // distinct mtimes on coarse file-system clocks
  }
  ASSERT_TRUE(s->Get(KeyOf(0), 0).ok());
  SleepMs(15);
  ASSERT_TRUE(s->Put(KeyOf(5), 0, TaggedFrame(5, 1000)).ok());  // 6 records > budget: drop 1 and 2
  EXPECT_EQ(s->stats().evictions, 2u);
  for (uint64_t i = 0; i < 6; ++i)
    EXPECT_EQ(s->Get(KeyOf(i), 0).ok(), i != 1 && i != 2) << "key " << i;
  EXPECT_EQ(s->Put(KeyOf(9), 0, TaggedFrame(9, 6000)).code(), StatusCode::kInvalidArgument);
}

TEST(FileStore, LruOrderSurvivesReopen) {
  const std::string root = FreshTempDir("lru_reopen");
  const uint64_t rec = store::kRecordHeaderSize + 1000;
  {
    auto s = MustOpen("file://" + root);
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(s->Put(KeyOf(i), 0, TaggedFrame(i, 1000)).ok());
      SleepMs(15);
    }
    ASSERT_TRUE(s->Get(KeyOf(0), 0).ok());
    SleepMs(15);
  }
  auto s = MustOpen("file://" + root + "?max_bytes=" + std::to_string(3 * rec + 500));  // 4 records over, 3 under 90%
  ASSERT_TRUE(s->Put(KeyOf(3), 0, TaggedFrame(3, 1000)).ok());  // evicts the least recent: 1
  EXPECT_EQ(s->stats().evictions, 1u);
  EXPECT_TRUE(s->Get(KeyOf(0), 0).ok());
  EXPECT_EQ(s->Get(KeyOf(1), 0).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(s->Get(KeyOf(2), 0).ok());
  EXPECT_TRUE(s->Get(KeyOf(3), 0).ok());
}

// Several processes write the same and their own entries at once; every
// file ends whole and verified, each shared entry holds one writer's frame.
TEST(FileStore, ConcurrentProcessesWriteSafely) {
  const std::string root = FreshTempDir("procs");
  { ASSERT_NE(MustOpen("file://" + root), nullptr); }
  constexpr int kProcs = 4, kOps = 60, kShared = 5;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto s = OpenStore("file://" + root);
      if (!s.ok()) _exit(2);
      int bad = 0;
      for (int op = 0; op < kOps; ++op) {
        const uint64_t shared = static_cast<uint64_t>(op % kShared);
        if (!(*s)->Put(KeyOf(shared), 0, TaggedFrame(shared + 16 * (p * kOps + op), 100 + 997 * op % 30000)).ok())
          ++bad;
        if (!(*s)->Put(KeyOf(100 + p, op), 0, TaggedFrame(p, 2000)).ok()) ++bad;
        auto got = (*s)->Get(KeyOf(shared), 0);
        if (!got.ok() || FrameTag(*got) % 16 != static_cast<int64_t>(shared)) ++bad;
      }
      _exit(bad == 0 ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  size_t count = 0;
  ExpectAllVerify(root, &count);
  EXPECT_EQ(count, static_cast<size_t>(kShared + kProcs * kOps));
  auto s = MustOpen("file://" + root);
  for (uint64_t k = 0; k < kShared; ++k) {
    auto got = s->Get(KeyOf(k), 0);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(FrameTag(*got) % 16, static_cast<int64_t>(k));
  }
}

// kill -9 a writer in the middle of a burst: what it left either verifies or
// is a temp file, which the next open removes.
TEST(FileStore, WriterKilledMidBurstLeavesOnlyWholeRecords) {
  const std::string root = FreshTempDir("kill");
  { ASSERT_NE(MustOpen("file://" + root), nullptr); }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = OpenStore("file://" + root);
    if (!s.ok()) _exit(2);
    for (uint64_t i = 0;; ++i) (void)(*s)->Put(KeyOf(i % 64), 0, TaggedFrame(i, 200000));
  }
  SleepMs(150);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  size_t count = 0;
  ExpectAllVerify(root, &count);  // opening removed the dead writer's temp file
  EXPECT_GT(count, 0u);
}

}  // namespace
}  // namespace cachegen::testing_store
