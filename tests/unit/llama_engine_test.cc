// llama.cpp adapter: capture and inject of a sequence's KV. On stories260K
// where ../shared has it, else on the tiny random-weight model (CI): the
// checks hold on any model; those of stories260K's own numbers run on it only.
#include "cachegen/llama_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "cachegen/codec.h"
#include "random_model_fixture.h"

namespace cachegen {
namespace {

class LlamaEngineTest : public TinyRandomModelTest {
 protected:
  void SetUp() override {
    ModelAndText m = SharedOrRandomModel("data/tinystories/sample.txt", std::string::npos, 600);
    ASSERT_TRUE(m.model);
    model_ = m.model;
    stories_ = m.stories;
    auto toks = model_->Tokenize(m.text);
    ASSERT_TRUE(toks.ok());
    ASSERT_GT(toks->size(), 200u);
    tokens_ = {model_->info().bos};
    tokens_.insert(tokens_.end(), toks->begin(), toks->begin() + 200);
  }

  std::unique_ptr<LlamaContext> Context(const LlamaContextOptions& o) {
    auto c = LlamaContext::Create(model_, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Prefills all but the last token.
  void Prefill(LlamaContext& c, int32_t seq = 0) {
    const std::span<const int32_t> all(tokens_);
    EXPECT_TRUE(c.Eval(all.first(all.size() - 1), 0, seq).ok());
  }
  // Evaluates the last token; returns the logits after it.
  std::vector<float> NextLogits(LlamaContext& c, int32_t seq = 0) {
    const int32_t last = tokens_.back();
    auto st = c.Eval(std::span<const int32_t>(&last, 1), static_cast<int32_t>(tokens_.size() - 1), seq);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto l = c.Logits(0);
    return {l.begin(), l.end()};
  }

  // The KV shape of n tokens of this model.
  KVShape Shape(uint32_t n) const {
    const auto& in = model_->info();
    return {in.layers, in.kv_heads, in.head_dim, n};
  }

  std::shared_ptr<LlamaModel> model_;
  bool stories_ = false;
  std::vector<int32_t> tokens_;
};

TEST_F(LlamaEngineTest, ModelInfo) {
  // stories260K, or RandomModelPreset("tiny") and its generated vocabulary.
  const LlamaModelInfo& in = model_->info();
  const uint32_t layers = stories_ ? 5 : 2, kv_heads = stories_ ? 4 : 2, head_dim = stories_ ? 8 : 64;
  const uint32_t vocab = stories_ ? 512 : 380;
  EXPECT_EQ(in.architecture, "llama");
  EXPECT_EQ(in.layers, layers);
  EXPECT_EQ(in.kv_heads, kv_heads);
  EXPECT_EQ(in.head_dim, head_dim);
  EXPECT_EQ(in.vocab, vocab);
  EXPECT_EQ(in.rope.kind, RopeParams::Kind::kNormal);
  EXPECT_EQ(in.rope.dims, head_dim);
  EXPECT_EQ(in.rope.freq_base, 10000.0);
}

// Capture, inject unchanged into a fresh context: next-token logits bit-identical,
// for every cache type, both V layouts and one or two streams.
TEST_F(LlamaEngineTest, RoundTripIsBitExact) {
  for (const char* type : {"f16", "f32", "bf16"})
    for (int fa : {0, 1})
      for (bool unified : {true, false}) {
        SCOPED_TRACE(testing::Message() << type << " flash_attn " << fa << " unified " << unified);
        LlamaContextOptions o;
        o.threads = 1;
        o.n_ctx = 256;
        o.cache = {type, type};
        o.flash_attn = fa;
        o.n_seq = 2;
        o.unified = unified;
        const int32_t seq = 1;
        auto src = Context(o);
        ASSERT_TRUE(src);
        Prefill(*src, seq);
        auto cap = src->Capture(seq);
        ASSERT_TRUE(cap.ok()) << cap.status().ToString();
        EXPECT_EQ(cap->kv.shape(), Shape(static_cast<uint32_t>(tokens_.size() - 1)));
        EXPECT_EQ(cap->positions.back(), static_cast<int32_t>(tokens_.size() - 2));
        const auto want = NextLogits(*src, seq);

        auto dst = Context(o);
        ASSERT_TRUE(dst);
        auto st = dst->Inject(seq, cap->kv.view(), cap->positions);
        ASSERT_TRUE(st.ok()) << st.ToString();
        // What cachegen wrote reads back unchanged.
        auto again = dst->Capture(seq);
        ASSERT_TRUE(again.ok());
        ASSERT_EQ(again->kv.size_bytes(), cap->kv.size_bytes());
        EXPECT_EQ(std::memcmp(again->kv.data(), cap->kv.data(), cap->kv.size_bytes()), 0);
        EXPECT_EQ(again->positions, cap->positions);
        const auto got = NextLogits(*dst, seq);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      }
}

// Appending the captured KV chunk by chunk (as a stream delivers it) is the
// same as injecting it at once: the same cells read back, bit-identical logits.
TEST_F(LlamaEngineTest, AppendChunkByChunkIsBitExact) {
  for (const char* type : {"f16", "f32", "bf16"})
    for (int fa : {0, 1}) {
      SCOPED_TRACE(testing::Message() << type << " flash_attn " << fa);
      LlamaContextOptions o;
      o.threads = 1;
      o.n_ctx = 256;
      o.cache = {type, type};
      o.flash_attn = fa;
      o.n_seq = 2;
      auto src = Context(o);
      ASSERT_TRUE(src);
      Prefill(*src);
      auto cap = src->Capture(0);
      ASSERT_TRUE(cap.ok()) << cap.status().ToString();
      const auto want = NextLogits(*src);

      auto dst = Context(o);
      ASSERT_TRUE(dst);
      const uint32_t n = cap->kv.shape().tokens;  // 200: chunks of 64, 64, 64, 8
      for (uint32_t at = 0; at < n; at += 64) {
        const uint32_t len = std::min(64u, n - at);
        auto st = dst->Append(0, 1, cap->kv.view().Tokens(at, len), static_cast<int32_t>(at));
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
      auto again = dst->Capture(0);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      ASSERT_EQ(again->kv.size_bytes(), cap->kv.size_bytes());
      EXPECT_EQ(std::memcmp(again->kv.data(), cap->kv.data(), cap->kv.size_bytes()), 0);
      EXPECT_EQ(again->positions, cap->positions);
      EXPECT_FALSE(dst->Capture(1).ok());  // the scratch sequence is left empty
      const auto got = NextLogits(*dst);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
}

TEST_F(LlamaEngineTest, AppendRejectsGapsAndBadSequences) {
  LlamaContextOptions o;
  o.threads = 1;
  o.n_ctx = 256;
  o.n_seq = 2;
  auto c = Context(o);
  ASSERT_TRUE(c);
  Prefill(*c);
  auto cap = c->Capture(0);
  ASSERT_TRUE(cap.ok());
  const KVView chunk = cap->kv.view().Tokens(0, 16);
  c->Clear();
  EXPECT_EQ(c->Append(0, 1, chunk, 16).code(), StatusCode::kInvalidArgument);  // a gap before position 16
  ASSERT_TRUE(c->Append(0, 1, chunk, 0).ok());
  EXPECT_EQ(c->Append(0, 1, chunk, 0).code(), StatusCode::kInvalidArgument);  // overlaps what is there
  EXPECT_EQ(c->Append(0, 0, chunk, 16).code(), StatusCode::kInvalidArgument);  // scratch == seq
  EXPECT_EQ(c->Append(0, 2, chunk, 16).code(), StatusCode::kInvalidArgument);  // no sequence 2
  EXPECT_EQ(c->Append(1, 0, chunk, 0).code(), StatusCode::kInvalidArgument);   // scratch 0 is not empty
  ASSERT_TRUE(c->Append(0, 1, chunk, 16).ok());
  o.unified = false;
  auto split = Context(o);
  ASSERT_TRUE(split);
  EXPECT_EQ(split->Append(0, 1, chunk, 0).code(), StatusCode::kUnsupported);
}

// Capture -> cachegen encode/decode -> inject: the logits move, but only a little.
TEST_F(LlamaEngineTest, CodecRoundTripChangesLogitsSlightly) {
  LlamaContextOptions o;
  o.threads = 1;
  o.n_ctx = 256;
  auto src = Context(o);
  ASSERT_TRUE(src);
  Prefill(*src);
  auto cap = src->Capture(0);
  ASSERT_TRUE(cap.ok());
  const auto want = NextLogits(*src);

  // fp16 of an f16 cache is exact: the logits do not move at all.
  {
    CodecConfig fp16;
    fp16.codec = "fp16";
    auto bytes = Encoder::Create(fp16)->Encode(cap->kv.view());
    ASSERT_TRUE(bytes.ok());
    auto kv = Decoder::Open(*bytes)->Decode(DType::kF16);
    ASSERT_TRUE(kv.ok());
    auto dst = Context(o);
    ASSERT_TRUE(dst->Inject(0, kv->view(), cap->positions).ok());
    const auto got = NextLogits(*dst);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
  CodecConfig cfg;
  cfg.bits_per_value = 5;
  auto enc = Encoder::Create(cfg);
  ASSERT_TRUE(enc.ok());
  auto bytes = enc->Encode(cap->kv.view());
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  auto kv = dec->Decode(DType::kF16);
  ASSERT_TRUE(kv.ok());

  auto dst = Context(o);
  ASSERT_TRUE(dst);
  ASSERT_TRUE(dst->Inject(0, kv->view(), cap->positions).ok());
  const auto got = NextLogits(*dst);
  double max_diff = 0, range = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, double{std::fabs(got[i] - want[i])});
    range = std::max(range, double{std::fabs(want[i])});
  }
  EXPECT_GT(max_diff, 0.0);            // lossy: something changed
  EXPECT_LT(max_diff, 0.05 * range);   // but little
  const auto top = [](const std::vector<float>& l) { return std::max_element(l.begin(), l.end()) - l.begin(); };
  EXPECT_EQ(top(got), top(want));
}

// A request's cancel ends its evaluation: before it starts, and mid-batch
// (llama.cpp's abort callback), as kUnavailable and without llama.cpp's
// error lines on stderr; the context serves again once it is cleared.
TEST_F(LlamaEngineTest, ACancelledRequestEndsItsEvaluation) {
  auto c = Context({});
  ASSERT_TRUE(c);
  c->SetCancel([] { return true; });
  const std::span<const int32_t> all(tokens_);
  Status st = c->Eval(all, 0);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("the client has gone"), std::string::npos) << st.ToString();
  int polls = 0;
  c->SetCancel([&polls] { return ++polls > 2; });  // passes the check before the batch, fires inside it
  ::testing::internal::CaptureStderr();
  st = c->Eval(all, 0);
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_EQ(logged, "") << "an abort is not an error to log";
  c->SetCancel({});
  c->Clear();
  EXPECT_TRUE(c->Eval(all, 0).ok());
}

TEST_F(LlamaEngineTest, RejectsWrongShapesAndTypes) {
  LlamaContextOptions o;
  o.threads = 1;
  o.n_ctx = 64;
  auto c = Context(o);
  ASSERT_TRUE(c);
  KVShape fewer_layers = Shape(3);
  --fewer_layers.layers;
  KVTensor wrong(fewer_layers, DType::kF16);
  EXPECT_EQ(c->Inject(0, wrong.view()).code(), StatusCode::kInvalidArgument);
  KVTensor right(Shape(3), DType::kF16);
  EXPECT_EQ(c->Inject(1, right.view()).code(), StatusCode::kInvalidArgument);  // only sequence 0 exists
  EXPECT_EQ(c->Capture(0).status().code(), StatusCode::kNotFound);
  if (stories_) {  // q8_0 blocks of 32 do not fit stories260K's head dim 8: llama.cpp refuses the context.
    o.cache = {"q8_0", "q8_0"};
    o.flash_attn = 1;
    EXPECT_FALSE(LlamaContext::Create(model_, o).ok());
  }
  o.cache.k = "q3";
  EXPECT_EQ(LlamaContext::Create(model_, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cachegen
