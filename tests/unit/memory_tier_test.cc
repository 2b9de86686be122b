// WithMemoryTier (cachegen/store.h): reads go to memory first, misses to the
// backing store and are kept, writes reach both, the LRU holds what fits.
#include <gtest/gtest.h>

#include "cachegen/store.h"

namespace cachegen {
namespace {

ChunkKey Key(uint8_t n) {
  ChunkKey k{};
  k.bytes[0] = n;
  return k;
}

std::vector<uint8_t> Frame(uint8_t fill, size_t n = 1000) { return std::vector<uint8_t>(n, fill); }

TEST(MemoryTierTest, ReadsHitMemoryFirstAndKeepWhatTheBackingStoreGives) {
  auto back = OpenStore("mem://");
  ASSERT_TRUE(back.ok());
  ChunkStore* backing = back->get();
  ASSERT_TRUE(backing->Put(Key(1), 0, Frame(1)).ok());  // stored before the tier existed
  auto tier = WithMemoryTier(std::move(*back), 3000);
  ASSERT_TRUE(tier->Put(Key(2), 0, Frame(2)).ok());  // written through
  EXPECT_TRUE(backing->Get(Key(2), 0).ok());

  EXPECT_EQ(tier->stats().held_frames, 1u);
  auto first = tier->Get(Key(1), 0);  // a tier miss, read from the backing store and kept
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, Frame(1));
  StoreStats s = tier->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.held_frames, 2u);
  EXPECT_GT(s.held_bytes, 2000u);
  const uint64_t back_reads = backing->stats().hits;
  auto again = tier->Get(Key(1), 0);  // now from memory
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(backing->stats().hits, back_reads);
  EXPECT_EQ(tier->stats().hits, 1u);
  EXPECT_EQ(*tier->Size(Key(1), 0), 1000u);
  EXPECT_EQ(tier->Get(Key(9), 0).status().code(), StatusCode::kNotFound);

  // Past its size the least recently used frame leaves memory, not the backing store.
  ASSERT_TRUE(tier->Put(Key(3), 0, Frame(3)).ok());
  EXPECT_EQ(tier->stats().held_frames, 2u);
  EXPECT_EQ(tier->stats().evictions, 1u);
  EXPECT_TRUE(backing->Get(Key(2), 0).ok());
  EXPECT_TRUE(tier->Get(Key(2), 0).ok());  // back from the backing store

  ASSERT_TRUE(tier->Delete(Key(1), 0).ok());
  EXPECT_FALSE(backing->Get(Key(1), 0).ok());
  EXPECT_FALSE(tier->Get(Key(1), 0).ok());
  EXPECT_NE(tier->uri().find("mem://?max_bytes=3000+mem://"), std::string::npos) << tier->uri();
}

TEST(MemoryTierTest, AloneItIsAnLruAndAFrameLargerThanItIsRefused) {
  auto tier = WithMemoryTier(nullptr, 3000);
  ASSERT_TRUE(tier->Put(Key(1), 0, Frame(1)).ok());
  EXPECT_TRUE(tier->Get(Key(1), 0).ok());
  EXPECT_FALSE(tier->Put(Key(2), 0, Frame(2, 5000)).ok());
  // With a backing store the large frame is stored there, only not in memory.
  auto back = OpenStore("mem://");
  ASSERT_TRUE(back.ok());
  auto tiered = WithMemoryTier(std::move(*back), 3000);
  EXPECT_TRUE(tiered->Put(Key(2), 0, Frame(2, 5000)).ok());
  EXPECT_TRUE(tiered->Get(Key(2), 0).ok());
  EXPECT_EQ(tiered->stats().held_frames, 0u);
}

}  // namespace
}  // namespace cachegen
