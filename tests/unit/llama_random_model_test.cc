// make-model's random GGUF loads in llama.cpp with the shape asked for, and the
// adapter handles it (head dim 64: quantized caches run, capture refuses them).
// Needs no ../shared.
#include "engine/llama/random_model.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "cachegen/llama_engine.h"
#include "random_model_fixture.h"

namespace cachegen {
namespace {

using RandomModelTest = TinyRandomModelTest;

TEST_F(RandomModelTest, HasTheRequestedShape) {
  ASSERT_TRUE(model_);
  EXPECT_EQ(file_bytes_, std::filesystem::file_size(path_));
  const auto& in = (*model_)->info();
  EXPECT_EQ(in.layers, 2u);
  EXPECT_EQ(in.kv_heads, 2u);
  EXPECT_EQ(in.head_dim, 64u);
  EXPECT_EQ(in.rope.kind, RopeParams::Kind::kNormal);
  EXPECT_EQ(in.rope.dims, 64u);
  auto toks = (*model_)->Tokenize("Once upon a time");
  ASSERT_TRUE(toks.ok());
  EXPECT_GT(toks->size(), 3u);
  EXPECT_EQ((*model_)->Detokenize(*toks), " Once upon a time");
}

TEST_F(RandomModelTest, CaptureInjectIsBitExactAndQuantizedIsRefused) {
  ASSERT_TRUE(model_);
  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 40; ++i) toks.push_back(260 + (i * 7) % 100);
  for (const char* type : {"f16", "q8_0"}) {
    SCOPED_TRACE(type);
    LlamaContextOptions o;
    o.n_ctx = 64;
    o.threads = 1;
    o.cache_type = type;
    o.flash_attn = 1;
    auto src = LlamaContext::Create(*model_, o);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    ASSERT_TRUE((*src)->Eval(std::span<const int32_t>(toks).first(toks.size() - 1), 0).ok());
    auto cap = (*src)->Capture(0);
    if (std::string(type) == "q8_0") {
      ASSERT_FALSE(cap.ok());
      EXPECT_EQ(cap.status().code(), StatusCode::kUnsupported);
      EXPECT_NE(cap.status().message().find("q8_0"), std::string::npos) << cap.status().message();
      continue;
    }
    ASSERT_TRUE(cap.ok()) << cap.status().ToString();
    EXPECT_EQ(cap->kv.shape(), (KVShape{2, 2, 64, 40}));
    const int32_t last = toks.back();
    ASSERT_TRUE((*src)->Eval(std::span<const int32_t>(&last, 1), 40).ok());
    auto want = (*src)->Logits(0);
    auto dst = LlamaContext::Create(*model_, o);
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE((*dst)->Inject(0, cap->kv.view(), cap->positions).ok());
    ASSERT_TRUE((*dst)->Eval(std::span<const int32_t>(&last, 1), 40).ok());
    auto got = (*dst)->Logits(0);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size_bytes()), 0);
  }
}

// The abort flag ends an evaluation between layers and fails the next ones
// at once; cleared, the context evaluates again.
TEST_F(RandomModelTest, AnAbortEndsTheEvaluationEarly) {
  ASSERT_TRUE(model_);
  std::atomic<bool> abort{false};
  bool abort_at_first_layer = true;
  std::vector<uint32_t> layers_seen;
  LlamaContextOptions o;
  o.n_ctx = 64;
  o.threads = 1;
  o.abort = &abort;
  o.query_observer = [&](uint32_t layer, int32_t, std::span<const float>) {
    layers_seen.push_back(layer);
    if (abort_at_first_layer) abort = true;  // as a server's Stop would, while the first layer runs
  };
  auto ctx = LlamaContext::Create(*model_, o);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 40; ++i) toks.push_back(260 + (i * 7) % 100);
  Status st = (*ctx)->Eval(toks, 0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("aborted"), std::string::npos) << st.ToString();
  EXPECT_EQ(layers_seen, std::vector<uint32_t>{0}) << "layer 1 ran after the abort";
  st = (*ctx)->Eval(toks, 0);
  EXPECT_NE(st.message().find("aborted"), std::string::npos) << st.ToString();
  EXPECT_EQ(layers_seen.size(), 1u) << "an evaluation started while aborting";

  abort = false;
  abort_at_first_layer = false;
  (*ctx)->Clear();
  layers_seen.clear();
  EXPECT_TRUE((*ctx)->Eval(toks, 0).ok());
  EXPECT_EQ(layers_seen, (std::vector<uint32_t>{0, 1}));
}

// A file that is not a model fails with llama.cpp's own reason in the error,
// not on stderr before it.
TEST(LlamaModelLoadTest, ANonModelFileSaysWhy) {
  const std::string path = (std::filesystem::temp_directory_path() / "cachegen-not-a-model.gguf").string();
  { std::ofstream(path) << "not a model"; }
  auto m = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("magic"), std::string::npos) << m.status().message();
}

TEST(RandomModelPresetTest, RejectsBadShapes) {
  EXPECT_FALSE(engine::RandomModelPreset("gpt-5").ok());
  auto s = engine::RandomModelPreset("tiny");
  ASSERT_TRUE(s.ok());
  s->heads = 3;
  EXPECT_EQ(engine::WriteRandomModel(*s, "/nonexistent/x.gguf").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cachegen
