#include "kv/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace cachegen {
namespace {

const KVShape kShape{4, 2, 64, 256};

TEST(SyntheticTest, DeterministicForSeed) {
  auto a = SyntheticKV(kShape, DType::kF16, 42);
  auto b = SyntheticKV(kShape, DType::kF16, 42);
  auto c = SyntheticKV(kShape, DType::kF16, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size_bytes()), 0);
  EXPECT_NE(std::memcmp(a->data(), c->data(), a->size_bytes()), 0);
  EXPECT_TRUE(CheckFinite(a->view()).ok());
}

TEST(SyntheticTest, RejectsBadShapes) {
  EXPECT_FALSE(SyntheticKV(KVShape{1, 1, 0, 4}, DType::kF32, 1).ok());
  EXPECT_FALSE(SyntheticKV(KVShape{1, 1, 7, 4}, DType::kF32, 1).ok());  // odd head_dim with RoPE
  SyntheticOptions o;
  o.rope = false;
  EXPECT_TRUE(SyntheticKV(KVShape{1, 1, 7, 4}, DType::kF32, 1, o).ok());
}

// Per-channel RMS of layer l's K or V.
std::vector<double> ChannelRms(const KVTensor& t, uint32_t l, KV kv) {
  const uint64_t C = t.shape().channels();
  std::vector<double> rms(C, 0);
  std::vector<float> row(C);
  for (uint32_t tok = 0; tok < t.shape().tokens; ++tok) {
    t.view().ReadRow(l, kv, tok, row.data());
    for (uint64_t c = 0; c < C; ++c) rms[c] += static_cast<double>(row[c]) * row[c];
  }
  for (double& r : rms) r = std::sqrt(r / t.shape().tokens);
  return rms;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(SyntheticTest, KeysHaveOutlierChannels) {
  SyntheticOptions o;
  o.rope = false;  // RoPE mixes channel pairs; check the raw channel structure
  auto t = SyntheticKV(kShape, DType::kF32, 5, o);
  ASSERT_TRUE(t.ok());
  for (uint32_t l = 0; l < kShape.layers; ++l) {
    const std::vector<double> k = ChannelRms(*t, l, KV::kKey);
    const double med = Median(k);
    int outliers = 0;
    for (double r : k) outliers += r > 4 * med;
    EXPECT_GE(outliers, 2) << "layer " << l;
    EXPECT_LE(outliers, 2 * static_cast<int>(kShape.kv_heads) * 2);
    // Values have no such outliers.
    const std::vector<double> v = ChannelRms(*t, l, KV::kValue);
    const double vmed = Median(v);
    for (double r : v) EXPECT_LT(r, 4 * vmed);
  }
  // With RoPE, outliers persist as large-magnitude channel pairs.
  auto r = SyntheticKV(kShape, DType::kF32, 5);
  ASSERT_TRUE(r.ok());
  const std::vector<double> k = ChannelRms(*r, 0, KV::kKey);
  EXPECT_GT(*std::max_element(k.begin(), k.end()), 3 * Median(k));
}

// Mean lag-1 autocorrelation over channels of layer l.
double Lag1(const KVTensor& t, uint32_t l, KV kv) {
  const uint64_t C = t.shape().channels();
  const uint32_t T = t.shape().tokens;
  std::vector<std::vector<float>> rows(T, std::vector<float>(C));
  for (uint32_t tok = 0; tok < T; ++tok) t.view().ReadRow(l, kv, tok, rows[tok].data());
  double sum = 0;
  for (uint64_t c = 0; c < C; ++c) {
    double m = 0;
    for (uint32_t tok = 0; tok < T; ++tok) m += rows[tok][c];
    m /= T;
    double num = 0, den = 0;
    for (uint32_t tok = 0; tok < T; ++tok) {
      const double d = rows[tok][c] - m;
      den += d * d;
      if (tok > 0) num += d * (rows[tok - 1][c] - m);
    }
    sum += num / den;
  }
  return sum / static_cast<double>(C);
}

TEST(SyntheticTest, TokensAreCorrelated) {
  SyntheticOptions o;
  o.rope = false;
  auto t = SyntheticKV(kShape, DType::kF32, 9, o);
  ASSERT_TRUE(t.ok());
  const double k = Lag1(*t, 1, KV::kKey), v = Lag1(*t, 1, KV::kValue);
  EXPECT_GT(k, 0.7);
  EXPECT_LT(k, 0.97);
  EXPECT_GT(v, 0.1);
  EXPECT_LT(v, k);
  // RoPE keeps keys correlated over neighbouring tokens (low-frequency pairs barely rotate).
  auto r = SyntheticKV(kShape, DType::kF32, 9);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(Lag1(*r, 1, KV::kKey), 0.4);
}

TEST(SyntheticTest, LayersDifferInScale) {
  auto t = SyntheticKV(KVShape{8, 2, 32, 64}, DType::kF32, 3);
  ASSERT_TRUE(t.ok());
  std::vector<double> scale;
  for (uint32_t l = 0; l < 8; ++l) scale.push_back(Median(ChannelRms(*t, l, KV::kValue)));
  EXPECT_GT(*std::max_element(scale.begin(), scale.end()), 1.5 * *std::min_element(scale.begin(), scale.end()));
}

}  // namespace
}  // namespace cachegen
