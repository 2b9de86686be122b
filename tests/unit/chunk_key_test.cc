// Chunk key chain, token id parsing, prefix lookup and multi-turn puts.
#include <gtest/gtest.h>

#include <set>

#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "kv/synthetic.h"

namespace cachegen {
namespace {

std::vector<TokenId> Range(int n, int from = 0) {
  std::vector<TokenId> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i * 7 % 1000;
  return v;
}

TEST(ChunkKey, ChainSharesPrefixes) {
  const ChunkKey root = ChainRoot("model-a", "profile", 4);
  const auto a = Range(10);
  auto b = a;
  b[9] += 1;  // differs in the last (partial) chunk
  const auto ka = ChunkKeys(root, a, 4), kb = ChunkKeys(root, b, 4);
  ASSERT_EQ(ka.size(), 3u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  // A change in chunk 0 changes every later key (the key names its prefix).
  auto c = a;
  c[0] += 1;
  const auto kc = ChunkKeys(root, c, 4);
  for (int i = 0; i < 3; ++i) EXPECT_NE(ka[i], kc[i]);
  // The same tokens in chunk 1 after a different chunk 0 give a different key.
  EXPECT_NE(NextChunkKey(root, std::span(a).subspan(4, 4)), ka[1]);
  EXPECT_EQ(NextChunkKey(ka[0], std::span(a).subspan(4, 4)), ka[1]);
}

TEST(ChunkKey, RootBindsModelProfileAndChunkSize) {
  std::set<ChunkKey> roots = {ChainRoot("m", "p", 256), ChainRoot("m", "p", 128), ChainRoot("m2", "p", 256),
                              ChainRoot("m", "p2", 256), ChainRoot("mp", "", 256), ChainRoot("", "mp", 256)};
  EXPECT_EQ(roots.size(), 6u);
  EXPECT_EQ(ChainRoot("m", "p", 256), ChainRoot("m", "p", 256));
}

// A model's shared-profile key never names a chunk chain's root, and binds
// the model and how the profile was learned.
TEST(ChunkKey, ModelProfileKeyIsItsOwn) {
  std::set<ChunkKey> keys = {ModelProfileKey("m", "auto2"), ModelProfileKey("m2", "auto2"),
                             ModelProfileKey("m", "auto3"), ChainRoot("m", "auto2", 0)};
  EXPECT_EQ(keys.size(), 4u);
  EXPECT_EQ(ModelProfileKey("m", "auto2"), ModelProfileKey("m", "auto2"));
}

TEST(ChunkKey, KnownValueIsStable) {
  // Pins the byte layout of docs/SERVICE.md: changing it orphans stored chunks.
  const ChunkKey root = ChainRoot("model", "profile", 256);
  const std::vector<TokenId> t = {1, 2, 3};
  EXPECT_EQ(root.Hex().size(), 32u);
  static const std::string kRoot = root.Hex();
  EXPECT_EQ(ChainRoot("model", "profile", 256).Hex(), kRoot);
  EXPECT_NE(NextChunkKey(root, t), root);
}

TEST(ChunkKey, ParseTokenIds) {
  auto ok = ParseTokenIds("1, 2,3\n4\t-5  ");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<TokenId>{1, 2, 3, 4, -5}));
  EXPECT_TRUE(ParseTokenIds("").ok());
  EXPECT_FALSE(ParseTokenIds("1 2x 3").ok());
  EXPECT_FALSE(ParseTokenIds("99999999999").ok());
  EXPECT_FALSE(ParseTokenIds("1.5").ok());
}

// An encoder of two levels per chunk of 16 tokens (one thread).
Result<Encoder> TwoLevelEncoder() {
  CodecConfig cfg;
  cfg.chunk_tokens = 16;
  cfg.levels = 2;
  cfg.threads = 1;
  return Encoder::Create(cfg);
}

TEST(ChunkKey, LookupAndMultiTurnPutStoreOnlyNewChunks) {
  auto store = OpenStore("mem://");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto enc = TwoLevelEncoder();
  ASSERT_TRUE(enc.ok());
  auto kv = SyntheticKV({2, 2, 16, 64}, DType::kF16, 3);
  ASSERT_TRUE(kv.ok());
  const auto tokens = Range(64);
  const ChunkKey root = ChainRoot("m", "p", 16);

  // Turn 1: the first 40 tokens (chunks 16, 16, 8).
  auto first = PutContext(**store, root, std::span(tokens).first(40), kv->view().Tokens(0, 40), *enc);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->chunks, 3u);
  EXPECT_EQ(first->chunks_stored, 3u);
  EXPECT_EQ(first->frames, 6u);
  // Turn 2: all 64 tokens: chunks 0 and 1 are present; 2 (now full) and 3 are new.
  auto second = PutContext(**store, root, tokens, kv->view(), *enc);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->chunks, 4u);
  EXPECT_EQ(second->chunks_skipped, 2u);
  EXPECT_EQ(second->chunks_stored, 2u);

  const auto keys = ChunkKeys(root, tokens, 16);
  auto found = LookupPrefix(**store, keys, 2);
  ASSERT_EQ(found.size(), 4u);
  for (const auto& c : found) {
    ASSERT_EQ(c.level_bytes.size(), 2u);
    EXPECT_GE(c.level_bytes[0], c.level_bytes[1]);
    EXPECT_GT(c.level_bytes[1], 0u);
  }
  // Removing chunk 2 ends the prefix there (even though chunk 3 is present).
  ASSERT_TRUE((*store)->Delete(keys[2], 0).ok());
  ASSERT_TRUE((*store)->Delete(keys[2], 1).ok());
  EXPECT_EQ(LookupPrefix(**store, keys, 2).size(), 2u);
}

TEST(ChunkKey, PutRejectsMismatchedTokens) {
  auto store = OpenStore("mem://");
  ASSERT_TRUE(store.ok());
  auto enc = Encoder::Create(CodecConfig{});
  ASSERT_TRUE(enc.ok());
  auto kv = SyntheticKV({1, 1, 16, 32}, DType::kF16, 1);
  ASSERT_TRUE(kv.ok());
  const auto tokens = Range(31);
  EXPECT_FALSE(PutContext(**store, ChainRoot("m", "p", 256), tokens, kv->view(), *enc).ok());
}

// A container frame that does not decode (here: a payload byte flipped in
// chunk 1's level-1 frame) fails the put: chunk 0 is stored, no frame of
// chunk 1 is, and an intact container then stores the rest.
TEST(ChunkKey, PutContainerStoresNoChunkWithAFrameThatDoesNotDecode) {
  auto store = OpenStore("mem://");
  ASSERT_TRUE(store.ok());
  auto enc = TwoLevelEncoder();
  ASSERT_TRUE(enc.ok());
  auto kv = SyntheticKV({2, 2, 16, 32}, DType::kF16, 3);
  ASSERT_TRUE(kv.ok());
  auto bytes = enc->Encode(kv->view());
  ASSERT_TRUE(bytes.ok());
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  const ChunkEntry& chunk1 = dec->info().chunks[1];
  std::vector<uint8_t> damaged = *bytes;
  damaged[chunk1.frame_offset[1] + chunk1.frame_size[1] - 8] ^= 0x40;  // in the payload, not the header
  const auto tokens = Range(32);
  const ChunkKey root = ChainRoot("m", "p", 16);
  const auto keys = ChunkKeys(root, tokens, 16);
  auto put = PutContainer(**store, root, tokens, damaged);
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.status().message().find("chunk 1 level 1 does not decode"), std::string::npos)
      << put.status().message();
  for (const ChunkKey& key : keys)  // nothing stored, the sound chunk 0 neither
    for (uint32_t level : {0u, 1u}) EXPECT_FALSE((*store)->Get(key, level).ok());
  auto again = PutContainer(**store, root, tokens, *bytes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->chunks_skipped, 0u);
  EXPECT_EQ(again->chunks_stored, 2u);
}

}  // namespace
}  // namespace cachegen
