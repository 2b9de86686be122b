// Model profiles (include/cachegen/profile.h, FORMAT.md ".cgprof").
#include "cachegen/profile.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "codec/cachegen/profile_data.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "kv/synthetic.h"

namespace cachegen {
namespace {

const KVShape kShape{2, 2, 16, 96};

// Slices of one long synthetic context (one "model": the generator's channel
// structure depends on its seed): slices 0..2 train, slice 3 is held out.
std::vector<KVTensor> Contexts(uint32_t first, int n) {
  KVShape whole = kShape;
  whole.tokens = kShape.tokens * 4;
  const KVTensor kv = *SyntheticKV(whole, DType::kF16, 100);
  std::vector<KVTensor> out;
  for (int i = 0; i < n; ++i) out.push_back(kv.Slice((first + i) * kShape.tokens, kShape.tokens));
  return out;
}

std::shared_ptr<const Profile> Trained(const CodecConfig& cfg = {}) {
  const auto ctx = Contexts(0, 3);
  std::vector<KVView> views;
  for (const auto& t : ctx) views.push_back(t.view());
  auto p = Profile::Train(views, cfg);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : nullptr;
}

TEST(Profile, TrainParseRoundTrip) {
  auto p = Trained();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->layers(), kShape.layers);
  EXPECT_EQ(p->kv_heads(), kShape.kv_heads);
  EXPECT_EQ(p->head_dim(), kShape.head_dim);
  EXPECT_EQ(p->data().contexts, 3u);
  EXPECT_EQ(p->data().tokens, 3 * kShape.tokens);
  auto again = Profile::Parse(p->bytes());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->id(), p->id());
  EXPECT_EQ((*again)->bytes(), p->bytes());
  ByteReader tail(std::span<const uint8_t>(p->bytes()).last(8));
  EXPECT_EQ(tail.U64(), Checksum64(std::span<const uint8_t>(p->bytes()).first(p->bytes().size() - 8)));
}

std::shared_ptr<const Profile> WithSensitivity(const Profile& p, std::vector<float> w) {
  auto q = p.WithSensitivity(w);
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return q.ok() ? *q : nullptr;
}

TEST(Profile, SensitivitiesMakeVersion2AndRoundTrip) {
  auto p = Trained();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->bytes()[4], 1);  // no sensitivities: still written as version 1
  EXPECT_TRUE(p->data().sensitivity.empty());
  const std::vector<float> w = {1e-3f, 2e-4f, 4e-3f, 5e-4f};
  auto q = WithSensitivity(*p, w);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bytes()[4], 2);
  EXPECT_EQ(q->bytes().size(), p->bytes().size() + 4 * w.size());
  EXPECT_NE(q->id(), p->id());
  auto again = Profile::Parse(q->bytes());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->data().sensitivity, w);
  EXPECT_EQ((*again)->data().sigma_code, p->data().sigma_code);  // statistics untouched
  // Step factors: sqrt(gmean / w), geometric mean 1.
  const std::vector<float> f = (*again)->data().SensitivityStepFactors();
  ASSERT_EQ(f.size(), w.size());
  double log_sum = 0;
  for (size_t i = 0; i < f.size(); ++i) log_sum += std::log(f[i]);
  EXPECT_NEAR(log_sum, 0, 1e-5);
  EXPECT_NEAR(f[0] / f[2], std::sqrt(w[2] / w[0]), 1e-5);

  EXPECT_EQ(p->WithSensitivity(std::vector<float>{1, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->WithSensitivity(std::vector<float>{1, 2, 0, 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->WithSensitivity(std::vector<float>{1, 2, NAN, 1}).status().code(), StatusCode::kInvalidArgument);
}

// Truncations, flipped bytes and resealed invalid fields of `good`.
void ExpectHostileRejected(const std::vector<uint8_t>& good) {
  for (size_t len = 0; len < good.size(); len += 1 + len / 64)
    EXPECT_FALSE(Profile::Parse(std::span<const uint8_t>(good.data(), len)).ok()) << len;
  for (size_t i = 0; i < good.size(); i += 1 + i / 64) {
    auto bad = good;
    bad[i] ^= 0x20;
    EXPECT_FALSE(Profile::Parse(bad).ok()) << i;  // corrupt (unsupported for a version byte)
  }
  // Valid checksum, invalid fields: the field checks behind it.
  auto resealed = [](std::vector<uint8_t> b) {
    b.resize(b.size() - 8);
    ByteWriter w(&b);
    w.U64(Checksum64(b));
    return b;
  };
  auto v = good;
  v[4] = 3;  // version 3
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kUnsupported);
  v = good;
  v[6] |= 2;  // an unknown flag
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[8] = 0, v[9] = 0, v[10] = 0, v[11] = 0;  // layers 0
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[44] = 0xff, v[45] = 0xff;  // grid points 65535
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v.insert(v.end() - 8, 0);  // a trailing byte
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);
}

// Channel weights move a section's scales half-way (in log) towards
// ∝ 1/sqrt(w) within each head, keeping each head's geometric-mean scale;
// sections without weights keep their statistics.
TEST(Profile, ChannelWeightsMoveScalesWithinHeads) {
  const auto ctx = Contexts(0, 3);
  std::vector<KVView> views;
  for (const auto& t : ctx) views.push_back(t.view());
  auto plain = Profile::Train(views, CodecConfig{});
  ASSERT_TRUE(plain.ok());
  const uint32_t D = kShape.head_dim, C = kShape.kv_heads * D, sections = kShape.layers * 2;
  std::vector<std::vector<double>> w(sections);
  w[0].resize(C);
  for (uint32_t c = 0; c < C; ++c) w[0][c] = std::exp2(double(c % 4));
  auto weighted = Profile::Train(views, CodecConfig{}, w);
  ASSERT_TRUE(weighted.ok()) << weighted.status().ToString();
  const auto& a = (*plain)->data().sigma_code[0];
  const auto& b = (*weighted)->data().sigma_code[0];
  // Scale codes are 8 per octave: log2 s' = log2 s / 2 - (c % 4) / 4 + per-head constant.
  for (uint32_t h = 0; h < kShape.kv_heads; ++h) {
    double mean_a = 0, mean_b = 0, mean_pred = 0;
    std::vector<double> pred(D);
    for (uint32_t d = 0; d < D; ++d) {
      const uint32_t c = h * D + d;
      pred[d] = 0.5 * a[c] - 2.0 * (c % 4);
      mean_a += a[c] / double(D);
      mean_b += b[c] / double(D);
      mean_pred += pred[d] / double(D);
    }
    EXPECT_NEAR(mean_a, mean_b, 1.0) << "head " << h;
    for (uint32_t d = 0; d < D; ++d) EXPECT_NEAR(b[h * D + d], pred[d] + mean_a - mean_pred, 1.01) << h << " " << d;
  }
  for (uint32_t s = 1; s < sections; ++s) EXPECT_EQ((*plain)->data().sigma_code[s], (*weighted)->data().sigma_code[s]) << s;
  EXPECT_NE(a, b);
  EXPECT_NE((*plain)->id(), (*weighted)->id());

  auto bad = w;
  bad[0][3] = -1;
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad[0][3] = std::nan("");
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad = w;
  bad[0].pop_back();
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad = w;
  std::fill(bad[0].begin(), bad[0].end(), 0.0);
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, std::span(w).first(1)).ok());
  CodecConfig rotated;
  rotated.rotate = true;
  EXPECT_FALSE(Profile::Train(views, rotated, w).ok());
}

TEST(Profile, HostileBytesAreRejected) {
  auto p = Trained();
  ASSERT_TRUE(p);
  ExpectHostileRejected(p->bytes());
  auto resealed = [](std::vector<uint8_t> b) {
    b.resize(b.size() - 8);
    ByteWriter w(&b);
    w.U64(Checksum64(b));
    return b;
  };
  // Version 1 does not know the sensitivity flag.
  auto v = p->bytes();
  v[6] = 1;
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);

  auto q = WithSensitivity(*p, {1e-3f, 2e-4f, 4e-3f, 5e-4f});
  ASSERT_TRUE(q);
  ExpectHostileRejected(q->bytes());
  const size_t last = q->bytes().size() - 12;  // the last sensitivity
  for (float bad : {0.0f, -1.0f, NAN, INFINITY, 1e31f}) {
    v = q->bytes();
    std::memcpy(&v[last], &bad, 4);
    EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt) << bad;
  }
  v = q->bytes();
  v[6] = 0;  // flag cleared: the sensitivities are trailing bytes
  EXPECT_EQ(Profile::Parse(resealed(v)).status().code(), StatusCode::kCorrupt);
}

// With sensitivities, rate control gives the sensitive section finer steps
// (step ∝ 1/sqrt(w)) and still meets the bit target.
TEST(Profile, SensitivitiesSteerStepsAtTheBitTarget) {
  auto p = Trained();
  ASSERT_TRUE(p);
  // Section 2 (layer 1 K) 100x as sensitive: its step 10x finer than the others'.
  auto q = WithSensitivity(*p, {1, 1, 100, 1});
  ASSERT_TRUE(q);
  RegisterProfile(p);
  RegisterProfile(q);
  const KVTensor kv = Contexts(3, 1)[0];
  auto section_mse = [&](std::shared_ptr<const Profile> prof, double* bits) {
    CodecConfig cfg;
    cfg.bits_per_value = 2;
    cfg.profile = std::move(prof);
    auto bytes = Encoder::Create(cfg)->Encode(kv.view());
    EXPECT_TRUE(bytes.ok());
    *bits = double(bytes->size()) * 8 / double(kv.shape().values());
    auto out = Decoder::Open(*bytes)->Decode(DType::kF32);
    EXPECT_TRUE(out.ok());
    std::vector<double> mse(4, 0);
    const KVShape& s = kv.shape();
    for (uint32_t sec = 0; sec < 4; ++sec)
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const KV k = sec % 2 ? KV::kValue : KV::kKey;
            const double e = kv.view().Get(sec / 2, k, t, h, d) - out->view().Get(sec / 2, k, t, h, d);
            mse[sec] += e * e;
          }
    return mse;
  };
  double plain_bits = 0, weighted_bits = 0;
  const std::vector<double> plain = section_mse(p, &plain_bits), weighted = section_mse(q, &weighted_bits);
  // Within the codec's rate tolerance (cachegen_codec_test), as without them.
  EXPECT_NEAR(plain_bits, 2, 0.16);
  EXPECT_NEAR(weighted_bits, 2, 0.16);
  // Relative to section 3 (layer 1 V), section 2's error falls by far more
  // than the rule's key scale alone gives.
  EXPECT_LT(weighted[2] / weighted[3], 0.2 * plain[2] / plain[3])
      << weighted[2] << " " << weighted[3] << " " << plain[2] << " " << plain[3];
}

// Encodes a context in small chunks at a fixed step with and without the profile.
struct Coded {
  std::vector<uint8_t> bytes;
  double snr_db = 0;
};
Coded Code(const KVTensor& kv, std::shared_ptr<const Profile> profile) {
  CodecConfig cfg;
  cfg.max_rel_error = 0.25;
  cfg.chunk_tokens = 32;
  cfg.profile = std::move(profile);
  auto enc = Encoder::Create(cfg);
  EXPECT_TRUE(enc.ok());
  Coded c;
  c.bytes = *enc->Encode(kv.view());
  auto dec = Decoder::Open(c.bytes);
  EXPECT_TRUE(dec.ok());
  auto out = dec->Decode(DType::kF32);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return c;
  double p = 0, e = 0;
  const KVShape& s = kv.shape();
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV k : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const double x = kv.view().Get(l, k, t, h, d), y = out->view().Get(l, k, t, h, d);
            p += x * x;
            e += (x - y) * (x - y);
          }
  c.snr_db = 10 * std::log10(p / e);
  return c;
}

TEST(Profile, SmallChunksGetSmallerAndDecodeOnlyWithTheProfile) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const KVTensor kv = Contexts(3, 1)[0];  // not a training context
  RegisterProfile(p);
  const Coded plain = Code(kv, nullptr), with = Code(kv, p);
  EXPECT_LT(with.bytes.size() * 10, plain.bytes.size() * 9)
      << "with profile " << with.bytes.size() << " B, without " << plain.bytes.size() << " B";
  EXPECT_GT(with.snr_db, plain.snr_db - 3.0);

  // A profile nobody registered: the frames name it, decoding says so.
  CodecConfig other;
  other.group_tokens = 1;
  auto q = Trained(other);
  ASSERT_TRUE(q);
  ASSERT_NE(q->id(), p->id());
  CodecConfig cfg;
  cfg.profile = q;
  auto bytes = Encoder::Create(cfg)->Encode(kv.view());
  ASSERT_TRUE(bytes.ok());
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  auto out = dec->Decode(DType::kF32);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kNotFound);
  EXPECT_NE(out.status().message().find("profile"), std::string::npos);
  RegisterProfile(q);
  EXPECT_TRUE(dec->Decode(DType::kF32).ok());
}

TEST(Profile, EncoderRejectsMismatchedSettings) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const KVTensor kv = Contexts(3, 1)[0];
  CodecConfig cfg;
  cfg.profile = p;
  cfg.rope.kind = RopeConfig::Kind::kNormal;  // trained without RoPE
  EXPECT_EQ(Encoder::Create(cfg)->Encode(kv.view()).status().code(), StatusCode::kInvalidArgument);
  auto small = SyntheticKV(KVShape{1, 2, 16, 32}, DType::kF16, 3);
  cfg.rope = RopeConfig{};
  EXPECT_EQ(Encoder::Create(cfg)->Encode(small->view()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cachegen
