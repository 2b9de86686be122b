// Slot files written by llama.cpp itself (llama_state_seq_save_file, what
// llama-server's slot save calls) through cachegen slot compress/restore, on
// stories260K (../shared) or, without it, a random-weight model.
#include "engine/llama_slot_file.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <llama.h>

#include "cachegen/llama_engine.h"
#include "engine/llama/ggml_quantizer.h"
#include "kv/io.h"
#include "random_model_fixture.h"

namespace cachegen::engine {
namespace {

// Without ../shared (a clean clone, CI) the suite runs on the tiny
// random-weight model instead: the slot file's layout is the same.
class SlotFileTest : public TinyRandomModelTest {
 protected:
  void SetUp() override {
    ModelAndText m = SharedOrRandomModel("data/tinystories/sample.txt", std::string::npos, 400);
    ASSERT_TRUE(m.model);
    llama_ = m.model;
    auto t = llama_->Tokenize(m.text);
    ASSERT_TRUE(t.ok());
    tokens_.assign(t->begin(), t->begin() + std::min<size_t>(t->size(), 200));
    slot_path_ = (std::filesystem::temp_directory_path() / ("cachegen-slot-" + std::to_string(getpid()) + ".bin")).string();
  }
  void TearDown() override {
    if (!slot_path_.empty()) std::filesystem::remove(slot_path_);
  }
  std::unique_ptr<LlamaContext> Context() {
    LlamaContextOptions o;
    o.n_ctx = 256;
    auto c = LlamaContext::Create(llama_, o);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return std::move(*c);
  }
  // A slot file of the prefilled tokens, written by llama.cpp.
  std::vector<uint8_t> SavedSlot(LlamaContext& ctx) {
    EXPECT_TRUE(ctx.Eval(tokens_, 0).ok());
    EXPECT_GT(llama_state_seq_save_file(ctx.raw(), slot_path_.c_str(), 0, tokens_.data(), tokens_.size()), 0u);
    auto bytes = ReadFileBytes(slot_path_);
    EXPECT_TRUE(bytes.ok());
    return *bytes;
  }

  std::shared_ptr<LlamaModel> llama_;
  std::vector<int32_t> tokens_;
  std::string slot_path_;
};

TEST_F(SlotFileTest, Fp16RoundTripIsByteIdentical) {
  auto ctx = Context();
  const std::vector<uint8_t> slot = SavedSlot(*ctx);
  auto parsed = ParseLlamaSlotFile(slot);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->tokens, tokens_);
  CodecConfig fp16;
  fp16.codec = "fp16";
  auto packed = CompressSlotFile(slot, fp16, 4);
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  auto restored = RestoreSlotFile(*packed);
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  EXPECT_EQ(*restored, slot);
}

TEST_F(SlotFileTest, CompressedSlotLoadsIntoLlamaCppAndPredictsAlike) {
  auto ctx = Context();
  const std::vector<uint8_t> slot = SavedSlot(*ctx);
  const int32_t next = tokens_.back();
  ASSERT_TRUE(ctx->Eval(std::span<const int32_t>(&next, 1), static_cast<int32_t>(tokens_.size())).ok());
  std::vector<float> exact(ctx->Logits(0).begin(), ctx->Logits(0).end());

  // cachegen at its default rate, keys as cached and with the model's RoPE undone.
  for (bool rope : {false, true}) {
  SCOPED_TRACE(rope ? "rope" : "no rope");
  CodecConfig cfg;
  if (rope) cfg.rope = CodecRope(llama_->info());
  EncodeStats stats;
  auto packed = CompressSlotFile(slot, cfg, rope ? llama_->info().kv_heads : 0, &stats);
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  EXPECT_LT(packed->size() * 4, slot.size());  // well under a quarter of the f16 slot
  auto restored = RestoreSlotFile(*packed);
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  ASSERT_TRUE(WriteFileBytes(slot_path_, *restored).ok());

  auto fresh = Context();
  std::vector<int32_t> loaded(tokens_.size() + 8);
  size_t n_loaded = 0;
  ASSERT_GT(llama_state_seq_load_file(fresh->raw(), slot_path_.c_str(), 0, loaded.data(), loaded.size(), &n_loaded), 0u);
  loaded.resize(n_loaded);
  EXPECT_EQ(loaded, tokens_);
  ASSERT_TRUE(fresh->Eval(std::span<const int32_t>(&next, 1), static_cast<int32_t>(tokens_.size())).ok());
  std::span<const float> approx = fresh->Logits(0);
  ASSERT_EQ(approx.size(), exact.size());
  EXPECT_EQ(std::max_element(approx.begin(), approx.end()) - approx.begin(),
            std::max_element(exact.begin(), exact.end()) - exact.begin());
  }
}

// A slot of a q8_0 cache (the random model: head dim 64) compresses with
// ggml's quantizer and not without; restored, it loads into llama.cpp and
// predicts the same next token.
TEST_F(SlotFileTest, SlotsOfAQuantizedCacheNeedTheQuantizer) {
  ASSERT_TRUE(model_);
  LlamaContextOptions o;
  o.n_ctx = 256;
  o.cache = {"q8_0", "q8_0"};
  o.flash_attn = 1;
  auto ctx = LlamaContext::Create(*model_, o);
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 150; ++i) toks.push_back(260 + (i * 7) % 100);
  ASSERT_TRUE((*ctx)->Eval(toks, 0).ok());
  ASSERT_GT(llama_state_seq_save_file((*ctx)->raw(), slot_path_.c_str(), 0, toks.data(), toks.size()), 0u);
  auto slot = ReadFileBytes(slot_path_);
  ASSERT_TRUE(slot.ok());
  const int32_t next = 300;
  ASSERT_TRUE((*ctx)->Eval(std::span<const int32_t>(&next, 1), static_cast<int32_t>(toks.size())).ok());
  std::vector<float> exact((*ctx)->Logits(0).begin(), (*ctx)->Logits(0).end());

  CodecConfig cfg;
  cfg.chunk_tokens = 64;
  EXPECT_EQ(CompressSlotFile(*slot, cfg, 0).status().code(), StatusCode::kUnsupported);
  auto packed = CompressSlotFile(*slot, cfg, 0, nullptr, &LlamaGgmlQuantizer());
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  EXPECT_LT(packed->size(), slot->size() / 2);
  EXPECT_EQ(RestoreSlotFile(*packed).status().code(), StatusCode::kUnsupported);
  auto restored = RestoreSlotFile(*packed, 0, 0, nullptr, &LlamaGgmlQuantizer());
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  ASSERT_TRUE(WriteFileBytes(slot_path_, *restored).ok());
  auto dst = LlamaContext::Create(*model_, o);
  ASSERT_TRUE(dst.ok());
  std::vector<int32_t> loaded(toks.size());
  size_t n = 0;
  ASSERT_GT(llama_state_seq_load_file((*dst)->raw(), slot_path_.c_str(), 0, loaded.data(), loaded.size(), &n), 0u);
  EXPECT_EQ(n, toks.size());
  ASSERT_TRUE((*dst)->Eval(std::span<const int32_t>(&next, 1), static_cast<int32_t>(toks.size())).ok());
  auto got = (*dst)->Logits(0);
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
            std::max_element(exact.begin(), exact.end()) - exact.begin());
}

TEST_F(SlotFileTest, DamagedFilesAreErrorsNeverCrashes) {
  auto ctx = Context();
  std::vector<uint8_t> slot = SavedSlot(*ctx);
  CodecConfig cfg;
  cfg.chunk_tokens = 64;
  auto packed = CompressSlotFile(slot, cfg, 0);
  ASSERT_TRUE(packed.ok());
  // Every truncation, and a flipped byte at every position of the header and layout.
  for (size_t n = 0; n < packed->size(); n += 1 + n / 64)
    EXPECT_FALSE(RestoreSlotFile(std::span<const uint8_t>(packed->data(), n)).ok()) << n;
  const size_t header = 12 + 4 * tokens_.size() + 33 + 4 * tokens_.size() + 8;
  for (size_t i = 0; i < std::min(header, packed->size()); ++i) {
    std::vector<uint8_t> bad = *packed;
    bad[i] ^= 0x5a;
    EXPECT_FALSE(RestoreSlotFile(bad).ok()) << "flipped byte " << i;
  }
  // Slot files: wrong magic, unknown version, token count past the end.
  std::vector<uint8_t> bad = slot;
  bad[0] ^= 1;
  EXPECT_EQ(CompressSlotFile(bad, cfg, 0).status().code(), StatusCode::kCorrupt);
  bad = slot;
  bad[4] = 9;
  EXPECT_EQ(CompressSlotFile(bad, cfg, 0).status().code(), StatusCode::kUnsupported);
  bad = slot;
  bad[8] = bad[9] = bad[10] = 0xff;
  EXPECT_FALSE(CompressSlotFile(bad, cfg, 0).ok());
  EXPECT_FALSE(CompressSlotFile(std::span<const uint8_t>(slot.data(), slot.size() - 1), cfg, 0).ok());
}

}  // namespace
}  // namespace cachegen::engine
