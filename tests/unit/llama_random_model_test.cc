// make-model's random GGUF loads in llama.cpp with the shape asked for, and the
// adapter handles it (head dim 64: every cache type, quantized ones included).
// Needs no ../shared.
#include "engine/llama/random_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <gtest/gtest.h>

#include "cachegen/llama_engine.h"
#include "random_model_fixture.h"
#include "shared_data.h"

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

// Capture, inject unchanged into a fresh context: the same values read back
// and bit-identical next-token logits, for every cache type llama.cpp has
// (head dim 64: the quantized ones are stored Hadamard-rotated), K and V of
// one type with flash attention, and a quantized K with V f16 transposed.
void ExpectRoundTripIsBitExact(const std::shared_ptr<LlamaModel>& model, const std::vector<int32_t>& toks) {
  struct Case {
    const char* k;
    const char* v;
    int flash_attn;
  };
  std::vector<Case> cases;
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}) cases.push_back({t, t, 1});
  cases.push_back({"q8_0", "f16", 0});
  cases.push_back({"q4_0", "f16", 0});
  const int32_t n = static_cast<int32_t>(toks.size()) - 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.k << "/" << c.v << " flash_attn " << c.flash_attn);
    LlamaContextOptions o;
    o.n_ctx = static_cast<uint32_t>(toks.size()) + 8;
    o.threads = 1;
    o.cache = {c.k, c.v};
    o.flash_attn = c.flash_attn;
    auto src = LlamaContext::Create(model, o);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    ASSERT_TRUE((*src)->Eval(std::span<const int32_t>(toks).first(n), 0).ok());
    auto cap = (*src)->Capture(0);
    ASSERT_TRUE(cap.ok()) << cap.status().ToString();
    const LlamaModelInfo& in = model->info();
    EXPECT_EQ(cap->kv.shape(), (KVShape{in.layers, in.kv_heads, in.head_dim, static_cast<uint32_t>(n)}));
    if (std::string(c.k) != c.v || std::string(c.k).starts_with("q") || std::string(c.k).starts_with("iq")) {
      EXPECT_EQ(cap->kv.dtype(), DType::kF32);  // dequantized values are not all f16 values
    }
    const int32_t last = toks.back();
    ASSERT_TRUE((*src)->Eval(std::span<const int32_t>(&last, 1), n).ok());
    const std::vector<float> want((*src)->Logits(0).begin(), (*src)->Logits(0).end());

    auto dst = LlamaContext::Create(model, o);
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE((*dst)->Inject(0, cap->kv.view(), cap->positions).ok());
    auto again = (*dst)->Capture(0);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->kv.size_bytes(), cap->kv.size_bytes());
    EXPECT_EQ(std::memcmp(again->kv.data(), cap->kv.data(), cap->kv.size_bytes()), 0);
    ASSERT_TRUE((*dst)->Eval(std::span<const int32_t>(&last, 1), n).ok());
    auto got = (*dst)->Logits(0);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size_bytes()), 0);
  }
}

TEST_F(RandomModelTest, EveryCacheTypeRoundTripsBitExact) {
  ASSERT_TRUE(model_);
  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 40; ++i) toks.push_back(260 + (i * 7) % 100);
  ExpectRoundTripIsBitExact(*model_, toks);
}

// The same on docs6L (trained, 6 layers, head dim 64) where ../shared has it.
TEST_F(RandomModelTest, EveryCacheTypeRoundTripsBitExactOnDocs6L) {
  const std::string path = test_data::SharedPath("models/docs6L.gguf");
  const std::string text = test_data::SharedPath("data/docs/dev.txt");
  if (path.empty() || text.empty()) GTEST_SKIP() << "no ../shared/models/docs6L.gguf";
  auto m = LlamaModel::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto toks = (*m)->Tokenize(test_data::ReadTextFile(text).substr(0, 4000));
  ASSERT_TRUE(toks.ok());
  ASSERT_GT(toks->size(), 200u);
  toks->resize(200);
  ExpectRoundTripIsBitExact(*m, *toks);
}

// Which caches llama.cpp stores rotated, and model_basis: a rotated cache's
// KV captured in the model's basis is the f16 cache's up to quantization,
// and injected back it gives the logits of the stored cache.
TEST_F(RandomModelTest, ModelBasisUndoesTheCachesRotation) {
  ASSERT_TRUE(model_);
  const LlamaModelInfo& in = (*model_)->info();
  EXPECT_EQ(CacheRotationOf(in, {"f16", "f16"}).k_block, 0u);
  EXPECT_EQ(CacheRotationOf(in, {"q8_0", "f16"}).k_block, 64u);
  EXPECT_EQ(CacheRotationOf(in, {"q8_0", "f16"}).v_block, 0u);
  EXPECT_EQ(CacheRotationOf(in, {"f16", "iq4_nl"}).v_block, 64u);
  LlamaModelInfo wide = in;
  wide.head_dim = 128;
  EXPECT_EQ(CacheRotationOf(wide, {"q4_0", "q4_0"}).k_block, 128u);
  EXPECT_EQ(CacheRotationOf(wide, {"q4_0", "q4_0"}).v_block, 64u);
  wide.head_dim = 96;
  EXPECT_EQ(CacheRotationOf(wide, {"q4_0", "q4_0"}).k_block, 0u);

  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 40; ++i) toks.push_back(260 + (i * 11) % 100);
  const int32_t n = static_cast<int32_t>(toks.size()) - 1, last = toks.back();
  auto capture = [&](const char* type, bool model_basis) {
    LlamaContextOptions o;
    o.n_ctx = 64;
    o.threads = 1;
    o.cache = {type, type};
    o.flash_attn = 1;
    o.model_basis = model_basis;
    auto c = LlamaContext::Create(*model_, o);
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE((*c)->Eval(std::span<const int32_t>(toks).first(n), 0).ok());
    auto cap = (*c)->Capture(0);
    EXPECT_TRUE(cap.ok());
    EXPECT_TRUE((*c)->Eval(std::span<const int32_t>(&last, 1), n).ok());
    std::vector<float> logits((*c)->Logits(0).begin(), (*c)->Logits(0).end());
    auto dst = LlamaContext::Create(*model_, o);
    EXPECT_TRUE((*dst)->Inject(0, cap->kv.view(), cap->positions).ok());
    EXPECT_TRUE((*dst)->Eval(std::span<const int32_t>(&last, 1), n).ok());
    std::vector<float> again((*dst)->Logits(0).begin(), (*dst)->Logits(0).end());
    return std::make_tuple(cap->kv.Converted(DType::kF32), logits, again);
  };
  // Relative squared distance of two captured tensors.
  auto distance = [](const KVTensor& a, const KVTensor& b) {
    const auto* x = reinterpret_cast<const float*>(a.data());
    const auto* y = reinterpret_cast<const float*>(b.data());
    double d = 0, e = 0;
    for (size_t i = 0; i < a.shape().values(); ++i) {
      d += double(x[i] - y[i]) * (x[i] - y[i]);
      e += double(x[i]) * x[i];
    }
    return d / e;
  };
  const auto [f16, f16_logits, f16_again] = capture("f16", true);
  const auto [stored, stored_logits, stored_again] = capture("q8_0", false);
  const auto [model, model_logits, model_again] = capture("q8_0", true);
  EXPECT_LT(distance(f16, model), 1e-3);   // q8_0's own error
  EXPECT_GT(distance(f16, stored), 0.5);   // another basis altogether
  EXPECT_EQ(stored_logits, stored_again);  // stored values: bit-exact
  EXPECT_EQ(model_logits, stored_logits);  // the same cache either way
  double worst = 0;                        // rotated back and forth: the logits of the stored cache, up to rounding
  for (size_t i = 0; i < model_logits.size(); ++i)
    worst = std::max(worst, double(std::fabs(model_again[i] - model_logits[i])));
  EXPECT_LT(worst, 1e-3);
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
