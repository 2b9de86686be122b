// Query observation and attention-derived channel weights (channel_weights.h)
// on a random-weight model made by our own tool. Needs no ../shared.
#include "engine/llama/channel_weights.h"

#include <cmath>

#include <gtest/gtest.h>

#include "cachegen/llama_engine.h"
#include "random_model_fixture.h"

namespace cachegen {
namespace {

class ChannelWeightsTest : public TinyRandomModelTest {
 protected:
  static std::vector<int32_t> Tokens(int n) {
    std::vector<int32_t> t = {1};
    for (int i = 1; i < n; ++i) t.push_back(260 + (i * 7) % 100);
    return t;
  }
};

struct Observed {
  uint32_t layer;
  int32_t pos0;
  size_t values;
};

TEST_F(ChannelWeightsTest, ObserverSeesEveryLayersQueriesAtTheirPositions) {
  ASSERT_TRUE(model_);
  const LlamaModelInfo& in = (*model_)->info();
  std::vector<Observed> seen;
  LlamaContextOptions o;
  o.n_ctx = 64;
  o.query_observer = [&](uint32_t layer, int32_t pos0, std::span<const float> q) {
    seen.push_back({layer, pos0, q.size()});
    for (float v : q) ASSERT_TRUE(std::isfinite(v));
  };
  auto ctx = LlamaContext::Create(*model_, o);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_TRUE(seen.empty()) << "the probe evaluation must not be reported";
  const auto toks = Tokens(30);
  ASSERT_TRUE((*ctx)->Eval(std::span(toks).first(20), 0).ok());
  ASSERT_TRUE((*ctx)->Eval(std::span(toks).subspan(20), 20).ok());
  ASSERT_EQ(seen.size(), size_t{in.layers} * 2);
  const size_t row = size_t{in.heads} * in.head_dim;
  for (uint32_t l = 0; l < in.layers; ++l) {
    EXPECT_EQ(seen[l].layer, l);
    EXPECT_EQ(seen[l].pos0, 0);
    EXPECT_EQ(seen[l].values, 20 * row);
    EXPECT_EQ(seen[in.layers + l].layer, l);
    EXPECT_EQ(seen[in.layers + l].pos0, 20);
    EXPECT_EQ(seen[in.layers + l].values, 10 * row);
  }
}

TEST_F(ChannelWeightsTest, GramsAreSymmetricWithPositiveDiagonal) {
  ASSERT_TRUE(model_);
  const LlamaModelInfo& in = (*model_)->info();
  auto g = engine::AttentionOutputGrams(path_, in);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->size(), in.layers);
  const uint32_t D = in.head_dim;
  for (const auto& layer : *g) {
    ASSERT_EQ(layer.size(), size_t{in.heads} * D * D);
    for (uint32_t j = 0; j < in.heads; ++j)
      for (uint32_t r = 0; r < D; ++r) {
        EXPECT_GT(layer[(j * D + r) * D + r], 0.0f);
        for (uint32_t c = 0; c < r; ++c)
          EXPECT_FLOAT_EQ(layer[(j * D + r) * D + c], layer[(j * D + c) * D + r]);
      }
  }
  EXPECT_FALSE(engine::AttentionOutputGrams(path_ + ".missing", in).ok());
}

// Weights for every section and channel, finite and positive; a window whose
// queries were not observed is an error, not zeros.
TEST_F(ChannelWeightsTest, AccumulatesWeightsFromAWindow) {
  ASSERT_TRUE(model_);
  const LlamaModelInfo& in = (*model_)->info();
  auto grams = engine::AttentionOutputGrams(path_, in);
  ASSERT_TRUE(grams.ok());
  engine::ChannelWeightAccumulator acc(in, CodecRope(in), *grams);
  LlamaContextOptions o;
  o.n_ctx = 64;
  o.query_observer = [&](uint32_t layer, int32_t pos0, std::span<const float> q) { acc.ObserveQueries(layer, pos0, q); };
  auto ctx = LlamaContext::Create(*model_, o);
  ASSERT_TRUE(ctx.ok());
  const auto toks = Tokens(40);
  ASSERT_TRUE((*ctx)->Eval(toks, 0).ok());
  auto cap = (*ctx)->Capture(0);
  ASSERT_TRUE(cap.ok()) << cap.status().ToString();
  ASSERT_TRUE(acc.AddWindow(cap->kv.view()).ok());
  const auto& w = acc.weights();
  ASSERT_EQ(w.size(), size_t{in.layers} * 2);
  const uint32_t D = in.head_dim;
  for (const auto& s : w) {
    ASSERT_EQ(s.size(), size_t{in.kv_heads} * D * D);  // a D x D matrix per KV head
    for (double v : s) EXPECT_TRUE(std::isfinite(v));
    for (uint32_t h = 0; h < in.kv_heads; ++h) {
      const double* m = &s[size_t{h} * D * D];
      for (uint32_t r = 0; r < D; ++r) {
        EXPECT_GT(m[r * D + r], 0.0);  // every channel matters
        for (uint32_t c = 0; c < D; ++c) {
          EXPECT_NEAR(m[r * D + c], m[c * D + r], 1e-9 * m[r * D + r] + 1e-300);  // symmetric
          // positive semidefinite, so |m_rc| <= sqrt(m_rr m_cc)
          EXPECT_LE(m[r * D + c] * m[r * D + c], m[r * D + r] * m[c * D + c] * (1 + 1e-9));
        }
      }
    }
  }
  EXPECT_FALSE(acc.AddWindow(cap->kv.view()).ok());  // its queries were consumed
}

}  // namespace
}  // namespace cachegen
