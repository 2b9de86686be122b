// Model profiles (include/cachegen/profile.h, FORMAT.md ".cgprof").
#include "cachegen/profile.h"

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "codec/cachegen/profile_data.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "common/simd.h"
#include "format/frame.h"
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

// Profiles of the format's versions 1 to 3 (no learned key transforms, no
// channel classes).
ProfileTrainOptions NoTransforms() {
  ProfileTrainOptions o;
  o.key_transform = false;
  o.key_channel_classes = false;
  return o;
}
// Key transforms without channel classes (version 3).
ProfileTrainOptions NoClasses() {
  ProfileTrainOptions o;
  o.key_channel_classes = false;
  return o;
}

std::shared_ptr<const Profile> Trained(const CodecConfig& cfg = {}, const ProfileTrainOptions& options = NoTransforms()) {
  const auto ctx = Contexts(0, 3);
  std::vector<KVView> views;
  for (const auto& t : ctx) views.push_back(t.view());
  auto p = Profile::Train(views, cfg, options);
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

// The same bytes with another version and flags, checksum renewed.
std::vector<uint8_t> Resealed(std::vector<uint8_t> b) {
  b.resize(b.size() - 8);
  ByteWriter w(&b);
  w.U64(Checksum64(b));
  return b;
}
std::vector<uint8_t> AsVersion(std::vector<uint8_t> b, uint8_t version, uint8_t flags) {
  b[4] = version, b[5] = 0, b[6] = flags, b[7] = 0;
  return Resealed(std::move(b));
}

TEST(Profile, SensitivitiesRoundTrip) {
  auto p = Trained();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->bytes()[4], 3);  // version 3 records the quantizer the tables are for
  EXPECT_EQ(p->bytes()[6], 0);  // no sensitivities, no transforms, uniform tables
  EXPECT_TRUE(p->data().sensitivity.empty());
  const std::vector<float> w = {1e-3f, 2e-4f, 4e-3f, 5e-4f};
  auto q = WithSensitivity(*p, w);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bytes()[4], 3);
  EXPECT_EQ(q->bytes()[6], 1);
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

  // Versions 1 and 2 (before the quantizer was recorded) still parse, not saying it.
  auto v1 = Profile::Parse(AsVersion(p->bytes(), 1, 0));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ((*v1)->data().tables_for, internal::ProfileData::TablesFor::kUnknown);
  EXPECT_EQ(p->data().tables_for, internal::ProfileData::TablesFor::kUniform);
  EXPECT_EQ((*v1)->data().sigma_code, p->data().sigma_code);
  auto v2 = Profile::Parse(AsVersion(q->bytes(), 2, 1));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ((*v2)->data().sensitivity, w);

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
  auto v = good;
  v[4] = 6;  // version 6
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kUnsupported);
  v = good;
  v[6] |= 32;  // an unknown flag
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[8] = 0, v[9] = 0, v[10] = 0, v[11] = 0;  // layers 0
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[44] = 0xff, v[45] = 0xff;  // grid points 65535
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v.insert(v.end() - 8, 0);  // a trailing byte
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
}

// A sensitivity curve (format version 5) round-trips, is validated, and
// predicts: the measured KL at its steps, KL ∝ step^2 below them, the last
// value above them, never falling where the measurement dipped.
TEST(Profile, SensitivityCurveRoundTripsAndPredicts) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const std::vector<float> w = {1e-3f, 2e-4f, 4e-3f, 5e-4f}, steps = {0.5f, 1, 2};
  const std::vector<float> kl = {1e-4f, 4e-4f, 9e-4f,  // section 0
                                 1e-5f, 3e-5f, 2e-5f,  // section 1: a dip at step 2
                                 1e-3f, 4e-3f, 1.6e-2f, 1e-4f, 5e-4f, 2e-3f};
  auto q = p->WithSensitivity(w, SensitivityCurve{steps, kl, 2e-5f, {}, {}});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ((*q)->bytes()[4], 5);
  EXPECT_EQ((*q)->bytes()[6] & 16, 16);
  auto again = Profile::Parse((*q)->bytes());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const internal::ProfileData& d = (*again)->data();
  EXPECT_EQ(d.curve_steps, steps);
  EXPECT_EQ(d.curve_kl, kl);
  EXPECT_EQ(d.q8_kl, 2e-5f);
  EXPECT_NEAR(d.SectionKl(0, 1), 4e-4, 1e-9);
  EXPECT_NEAR(d.SectionKl(0, 0.25), 1e-4 / 4, 1e-10);       // below: ∝ step^2
  EXPECT_NEAR(d.SectionKl(0, std::sqrt(2.0)), 6e-4, 1e-9);   // log-log between 4e-4 and 9e-4
  EXPECT_NEAR(d.SectionKl(0, 100), 9e-4, 1e-9);             // above: saturated
  EXPECT_NEAR(d.SectionKl(1, 2), 3e-5, 1e-10);              // the dip is not followed
  EXPECT_NEAR(d.SectionKl(1, 8), 3e-5, 1e-10);
  for (double s = 0.1; s < 10; s *= 1.1) EXPECT_LE(d.SectionKl(2, s), d.SectionKl(2, s * 1.1));
  // The joint calibration scales a sum by measured / predicted, log-log
  // between its points and the end ratios beyond them.
  SensitivityCurve joint{steps, kl, 2e-5f, {1e-4f, 1e-2f}, {2e-4f, 1e-2f}};
  auto calibrated = p->WithSensitivity(w, joint);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status().ToString();
  auto reparsed = Profile::Parse((*calibrated)->bytes());
  ASSERT_TRUE(reparsed.ok()) << reparsed.status().ToString();
  const internal::ProfileData& cd = (*reparsed)->data();
  EXPECT_NEAR(cd.CalibratedKl(1e-5), 2e-5, 1e-9);
  EXPECT_NEAR(cd.CalibratedKl(1e-3), 1e-3 * std::sqrt(2.0), 1e-8);
  EXPECT_NEAR(cd.CalibratedKl(1), 1, 1e-6);
  EXPECT_EQ(d.CalibratedKl(3e-3), 3e-3);  // no calibration
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{steps, kl, 0, {1e-2f, 1e-4f}, {1e-2f, 2e-4f}}).ok());  // falling
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{steps, kl, 0, {1e-4f}, {0.0f}}).ok());
  ExpectHostileRejected((*calibrated)->bytes());
  // Without a curve: sensitivity x step^2; without sensitivities: none.
  auto plain = WithSensitivity(*p, w);
  ASSERT_TRUE(plain);
  EXPECT_NEAR(plain->data().SectionKl(2, 3), 4e-3 * 9, 1e-7);  // f32 sensitivity
  EXPECT_EQ(p->data().SectionKl(0, 1), -1);

  // Invalid curves: one step, falling steps, a step of 0, a NaN or negative KL, a wrong count.
  const std::vector<float> one = {1}, falling = {1, 0.5f, 2}, zero = {0, 1, 2};
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{one, std::vector<float>(4, 1e-4f), 0, {}, {}}).ok());
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{falling, kl, 0, {}, {}}).ok());
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{zero, kl, 0, {}, {}}).ok());
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{steps, kl, NAN, {}, {}}).ok());
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{{}, {}, 1e-5f, {}, {}}).ok());  // a q8 reference without a curve
  for (float bad : {NAN, -1.0f, INFINITY}) {
    std::vector<float> k = kl;
    k[5] = bad;
    EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{steps, k, 0, {}, {}}).ok()) << bad;
  }
  EXPECT_FALSE(p->WithSensitivity(w, SensitivityCurve{steps, std::vector<float>(kl.begin(), kl.end() - 1), 0, {}, {}}).ok());
  // Hostile bytes: resealed falling steps, a curve flag without sensitivities, and the rest.
  std::vector<uint8_t> v = (*q)->bytes();
  const size_t first_step = v.size() - 8 - 1 - 4 - 4 * kl.size() - 4 * steps.size();
  const float big = 8;
  std::memcpy(&v[first_step], &big, 4);
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = (*q)->bytes();
  v[6] &= ~1;
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  ExpectHostileRejected((*q)->bytes());
}

// Channel weights move a section's scales half-way (in log) towards
// ∝ 1/sqrt(w) within each head, keeping each head's geometric-mean scale;
// sections without weights keep their statistics.
TEST(Profile, ChannelWeightsMoveScalesWithinHeads) {
  const auto ctx = Contexts(0, 3);
  std::vector<KVView> views;
  for (const auto& t : ctx) views.push_back(t.view());
  auto plain = Profile::Train(views, CodecConfig{}, NoTransforms());
  ASSERT_TRUE(plain.ok());
  const uint32_t D = kShape.head_dim, C = kShape.kv_heads * D, sections = kShape.layers * 2;
  // Per head a diagonal weight matrix: channel c weighs 2^(c % 4).
  ProfileTrainOptions o = NoTransforms();
  std::vector<std::vector<double>>& w = o.channel_weights;
  w.resize(sections);
  w[0].assign(size_t{C} * D, 0.0);
  for (uint32_t c = 0; c < C; ++c) w[0][(size_t{c / D} * D + c % D) * D + c % D] = std::exp2(double(c % 4));
  auto weighted = Profile::Train(views, CodecConfig{}, o);
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
  // The whole way (the default in sections with a key transform): log2 s' = -(c % 4) / 2 + per-head constant.
  ProfileTrainOptions whole = o;
  whole.channel_weight_strength = 1;
  auto full = Profile::Train(views, CodecConfig{}, whole);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  for (uint32_t h = 0; h < kShape.kv_heads; ++h) {
    const auto& f = (*full)->data().sigma_code[0];
    for (uint32_t d = 1; d < D; ++d) {
      const uint32_t c = h * D + d;
      EXPECT_NEAR(int(f[c]) - int(f[h * D]), -4.0 * (int(c % 4) - int((h * D) % 4)), 1.01) << h << " " << d;
    }
  }
  whole.channel_weight_strength = 1.5;
  EXPECT_EQ(Profile::Train(views, CodecConfig{}, whole).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a, b);
  EXPECT_NE((*plain)->id(), (*weighted)->id());

  auto bad = o;
  bad.channel_weights[0][3 * D + 3] = -1;  // channel 3's weight
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad.channel_weights[0][3 * D + 3] = std::nan("");
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad = o;
  bad.channel_weights[0].pop_back();
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad = o;
  std::fill(bad.channel_weights[0].begin(), bad.channel_weights[0].end(), 0.0);
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  bad = o;
  bad.channel_weights.pop_back();
  EXPECT_FALSE(Profile::Train(views, CodecConfig{}, bad).ok());
  CodecConfig rotated;
  rotated.rotate = true;
  EXPECT_FALSE(Profile::Train(views, rotated, o).ok());
}

TEST(Profile, HostileBytesAreRejected) {
  auto p = Trained();
  ASSERT_TRUE(p);
  ExpectHostileRejected(p->bytes());
  // Version 1 knows no flag, version 2 only the sensitivity flag.
  EXPECT_EQ(Profile::Parse(AsVersion(p->bytes(), 1, 1)).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(Profile::Parse(AsVersion(p->bytes(), 2, 4)).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(Profile::Parse(AsVersion(p->bytes(), 2, 2)).status().code(), StatusCode::kCorrupt);
  auto v = p->bytes();

  auto q = WithSensitivity(*p, {1e-3f, 2e-4f, 4e-3f, 5e-4f});
  ASSERT_TRUE(q);
  ExpectHostileRejected(q->bytes());
  const size_t last = q->bytes().size() - 12;  // the last sensitivity
  for (float bad : {0.0f, -1.0f, NAN, INFINITY, 1e31f}) {
    v = q->bytes();
    std::memcpy(&v[last], &bad, 4);
    EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt) << bad;
  }
  v = q->bytes();
  v[6] = 0;  // flag cleared: the sensitivities are trailing bytes
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
}

// Keys whose channels are strongly correlated within each head (each head's
// keys mix independent Laplacian sources of falling scale through a fixed
// random matrix), values independent: 4 slices of kShape, 0..2 train, 3 held out.
std::vector<KVTensor> CorrelatedContexts() {
  const uint32_t D = kShape.head_dim;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::exponential_distribution<float> expo(1.0f);
  std::vector<std::vector<float>> mix(kShape.layers * kShape.kv_heads, std::vector<float>(size_t{D} * D));
  for (auto& m : mix)
    for (float& v : m) v = normal(rng) / std::sqrt(float(D));
  auto laplace = [&] { return (rng() & 1 ? 1.0f : -1.0f) * expo(rng); };
  std::vector<KVTensor> out;
  std::vector<float> z(D), row(kShape.kv_heads * D);
  for (int i = 0; i < 4; ++i) {
    KVTensor t(kShape, DType::kF32);
    for (uint32_t l = 0; l < kShape.layers; ++l)
      for (uint32_t tok = 0; tok < kShape.tokens; ++tok) {
        for (uint32_t h = 0; h < kShape.kv_heads; ++h) {
          for (uint32_t d = 0; d < D; ++d) z[d] = laplace() * std::exp2(-float(d) / 3);
          const std::vector<float>& m = mix[l * kShape.kv_heads + h];
          for (uint32_t r = 0; r < D; ++r) {
            float x = 0;
            for (uint32_t d = 0; d < D; ++d) x += m[r * D + d] * z[d];
            row[h * D + r] = x;
          }
        }
        t.view().WriteRow(l, KV::kKey, tok, row.data());
        for (float& v : row) v = laplace();
        t.view().WriteRow(l, KV::kValue, tok, row.data());
      }
    out.push_back(std::move(t));
  }
  return out;
}

// `kv` coded at 2 bits/value with `profile`: decoded K, and bits/value.
KVTensor KeysAt2Bits(const KVTensor& kv, std::shared_ptr<const Profile> profile, double* bits) {
  CodecConfig cfg;
  cfg.bits_per_value = 2;
  cfg.profile = std::move(profile);
  auto bytes = Encoder::Create(cfg)->Encode(kv.view());
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  if (!bytes.ok()) return KVTensor(kv.shape(), DType::kF32);
  *bits = double(bytes->size()) * 8 / double(kv.shape().values());
  const ProfileSet profiles(cfg.profile);
  auto out = Decoder::Open(*bytes, &profiles)->Decode(DType::kF32);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? std::move(*out) : KVTensor(kv.shape(), DType::kF32);
}

// For head h of layer l and a unit direction v: the error variance of the
// decoded keys along v relative to the keys' own variance along v (how much
// a query along v sees its logits disturbed, relative to their spread).
double RelativeErrorAlong(const KVTensor& kv, const KVTensor& out, uint32_t l, uint32_t h, const float* v,
                          uint32_t stride) {
  const KVShape& s = kv.shape();
  double sum = 0, sum_sq = 0, err = 0;
  for (uint32_t t = 0; t < s.tokens; ++t) {
    double x = 0, e = 0;
    for (uint32_t d = 0; d < s.head_dim; ++d) {
      const double k = kv.view().Get(l, KV::kKey, t, h, d);
      x += v[d * stride] * k;
      e += v[d * stride] * (k - out.view().Get(l, KV::kKey, t, h, d));
    }
    sum += x, sum_sq += x * x, err += e * e;
  }
  const double n = s.tokens, var = sum_sq / n - (sum / n) * (sum / n);
  return err / n / var;
}

// Learned key transforms: orthonormal per K head, none for V, version 3. The
// coder's steps follow each coded channel's scale, so in the learned basis
// the error takes the keys' own covariance: a query along any direction sees
// the same error relative to its logits' spread, where per-channel coding
// leaves directions of little key variance (correlated channels cancelling)
// swamped. Checked on held-out keys along each head's most and least varying
// directions, at the same bit target.
TEST(Profile, KeyTransformsDecorrelateHeldOutKeys) {
  const auto ctx = CorrelatedContexts();
  std::vector<KVView> views;
  for (int i = 0; i < 3; ++i) views.push_back(ctx[i].view());
  auto with = Profile::Train(views, CodecConfig{}, NoClasses());
  auto without = Profile::Train(views, CodecConfig{}, NoTransforms());
  ASSERT_TRUE(with.ok() && without.ok());
  const internal::ProfileData& d = (*with)->data();
  EXPECT_EQ((*with)->bytes()[6], 2);  // the transforms flag
  EXPECT_EQ((*without)->bytes()[6], 0);
  EXPECT_TRUE((*without)->data().transform.empty());
  const uint32_t D = kShape.head_dim;
  for (uint32_t sec = 0; sec < kShape.layers * 2; ++sec) {
    ASSERT_EQ(d.HasTransform(sec), sec % 2 == 0) << sec;
    if (sec % 2) continue;
    ASSERT_EQ(d.transform[sec].size(), size_t{kShape.kv_heads} * D * D);
    for (uint32_t h = 0; h < kShape.kv_heads; ++h) {
      const float* u = &d.transform[sec][size_t{h} * D * D];
      for (uint32_t a = 0; a < D; ++a)
        for (uint32_t b = 0; b < D; ++b) {
          double dot = 0;
          for (uint32_t r = 0; r < D; ++r) dot += double(u[r * D + a]) * u[r * D + b];
          EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << sec << " " << h << " " << a << " " << b;
        }
    }
  }
  auto again = Profile::Parse((*with)->bytes());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->data().transform, d.transform);
  EXPECT_EQ((*again)->bytes(), (*with)->bytes());

  const KVTensor& held_out = ctx[3];
  double bits_with = 0, bits_without = 0;
  const KVTensor out_with = KeysAt2Bits(held_out, *with, &bits_with);
  const KVTensor out_without = KeysAt2Bits(held_out, *without, &bits_without);
  EXPECT_NEAR(bits_with, 2, 0.16);
  EXPECT_NEAR(bits_without, 2, 0.16);
  for (uint32_t l = 0; l < kShape.layers; ++l)
    for (uint32_t h = 0; h < kShape.kv_heads; ++h) {
      const float* u = &d.transform[2 * l][size_t{h} * D * D];
      const float *major = u, *minor = u + (D - 1);  // columns 0 and D - 1
      const double with_major = RelativeErrorAlong(held_out, out_with, l, h, major, D);
      const double with_minor = RelativeErrorAlong(held_out, out_with, l, h, minor, D);
      const double without_minor = RelativeErrorAlong(held_out, out_without, l, h, minor, D);
      EXPECT_LT(with_minor, 3 * with_major) << l << " " << h << ": " << with_minor << " vs " << with_major;
      EXPECT_GT(without_minor, 10 * with_minor) << l << " " << h << ": " << without_minor << " vs " << with_minor;
    }

  // Where a transform cannot hold: a max-error bound is per original value.
  CodecConfig bounded;
  bounded.max_rel_error = 0.25;
  bounded.profile = *with;
  EXPECT_EQ(Encoder::Create(bounded)->Encode(ctx[3].view()).status().code(), StatusCode::kInvalidArgument);
  // With rotation the transforms are not learned.
  CodecConfig rotated;
  rotated.rotate = true;
  auto r = Profile::Train(views, rotated);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->data().transform.empty());
}

TEST(Profile, HostileTransformsAreRejected) {
  const auto ctx = CorrelatedContexts();
  std::vector<KVView> views;
  for (int i = 0; i < 3; ++i) views.push_back(ctx[i].view());
  auto p = Profile::Train(views, CodecConfig{}, NoClasses());
  ASSERT_TRUE(p.ok());
  const std::vector<uint8_t>& good = (*p)->bytes();
  ExpectHostileRejected(good);
  // The block ends with section 3 (layer 1 V, no transform: one 0 byte),
  // after section 2's presence byte and its 2 heads x D x D floats.
  const size_t D = kShape.head_dim, matrices = kShape.kv_heads * D * D * 4;
  const size_t v_byte = good.size() - 9, first = v_byte - matrices, presence = first - 1;
  ASSERT_EQ(good[v_byte], 0);
  ASSERT_EQ(good[presence], 1);
  auto v = good;
  v[presence] = 2;
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  for (float bad : {NAN, INFINITY, 2.0f}) {  // a non-finite entry, a column not of unit length
    v = good;
    std::memcpy(&v[first], &bad, 4);
    EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt) << bad;
  }
  v = good;
  v[20] = 1;  // rotate
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[4] = 2;  // version 2 does not know the transforms flag
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
}

// Channel classes (format version 4): K sections get one table per class of
// channels whose quantizer inputs spread alike against their coded scales,
// V sections keep one per head. Channel weights (2^(c % 4) on layer 0's K)
// spread the coded scales within each head, so one table per head fits its
// channels badly; with classes the same frames take fewer bits, so at the
// same bit target the keys come out closer. The classes round-trip, and
// hostile class bytes are rejected.
TEST(Profile, ChannelClassesCodeKeysCloserAtEqualBits) {
  const auto ctx = Contexts(0, 3);
  std::vector<KVView> views;
  for (const auto& t : ctx) views.push_back(t.view());
  const uint32_t D = kShape.head_dim, C = kShape.kv_heads * D, sections = kShape.layers * 2;
  ProfileTrainOptions o = NoTransforms();
  o.channel_weights.resize(sections);
  o.channel_weights[0].assign(size_t{C} * D, 0.0);
  for (uint32_t c = 0; c < C; ++c) o.channel_weights[0][(size_t{c / D} * D + c % D) * D + c % D] = std::exp2(double(c % 4));
  auto without = Profile::Train(views, CodecConfig{}, o);
  o.key_channel_classes = true;
  auto with = Profile::Train(views, CodecConfig{}, o);
  ASSERT_TRUE(with.ok() && without.ok()) << with.status().ToString();
  const std::vector<uint8_t>& good = (*with)->bytes();
  EXPECT_EQ(good[4], 4);
  EXPECT_EQ(good[6], 8);  // the classes flag
  EXPECT_EQ((*without)->bytes()[4], 3);
  const internal::ProfileData& d = (*with)->data();
  EXPECT_EQ(d.sigma_code, (*without)->data().sigma_code);
  for (uint32_t sec = 0; sec < sections; ++sec) {
    if (sec % 2) {
      EXPECT_FALSE(d.HasClasses(sec)) << sec;
      continue;
    }
    ASSERT_TRUE(d.HasClasses(sec)) << sec;
    ASSERT_EQ(d.class_of[sec].size(), size_t{2} * C);
    for (uint8_t c : d.class_of[sec]) EXPECT_LT(c, d.classes[sec]);
  }
  // Layer 0's weighted K channels: four scales a head, four anchor classes at least.
  std::set<uint8_t> anchor_classes(d.class_of[0].begin(), d.class_of[0].begin() + C);
  EXPECT_GE(anchor_classes.size(), 4u);
  auto again = Profile::Parse(good);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->bytes(), good);
  EXPECT_EQ((*again)->data().class_of, d.class_of);

  const KVTensor held_out = Contexts(3, 1)[0];
  double bits_with = 0, bits_without = 0;
  const KVTensor out_with = KeysAt2Bits(held_out, *with, &bits_with);
  const KVTensor out_without = KeysAt2Bits(held_out, *without, &bits_without);
  EXPECT_NEAR(bits_with, 2, 0.16);
  EXPECT_NEAR(bits_without, 2, 0.16);
  auto key_mse = [&](const KVTensor& out) {
    double e = 0;
    for (uint32_t t = 0; t < kShape.tokens; ++t)
      for (uint32_t h = 0; h < kShape.kv_heads; ++h)
        for (uint32_t x = 0; x < D; ++x) {
          const double diff = held_out.view().Get(0, KV::kKey, t, h, x) - out.view().Get(0, KV::kKey, t, h, x);
          e += diff * diff;
        }
    return e;
  };
  const double mse_with = key_mse(out_with), mse_without = key_mse(out_without);
  EXPECT_LT(mse_with, mse_without) << mse_with << " vs " << mse_without;
  // The learned quantizer's rate term reads the class tables too.
  CodecConfig lloyd;
  lloyd.quantizer = CodecConfig::Quantizer::kLloyd;
  auto with_lloyd = Profile::Train(views, lloyd, o);
  ASSERT_TRUE(with_lloyd.ok()) << with_lloyd.status().ToString();
  ASSERT_TRUE((*with_lloyd)->data().HasClasses(0));
  CodecConfig cfg = lloyd;
  cfg.bits_per_value = 2;
  cfg.profile = *with_lloyd;
  auto bytes = Encoder::Create(cfg)->Encode(held_out.view());
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_NEAR(double(bytes->size()) * 8 / double(held_out.shape().values()), 2, 0.16);
  const ProfileSet lloyd_profiles(*with_lloyd);
  auto out_lloyd = Decoder::Open(*bytes, &lloyd_profiles)->Decode(DType::kF32);
  ASSERT_TRUE(out_lloyd.ok()) << out_lloyd.status().ToString();
  EXPECT_LT(key_mse(*out_lloyd), 1.5 * mse_with) << key_mse(*out_lloyd) << " vs " << mse_with;

  ExpectHostileRejected(good);
  // Section 0's class count follows its scale codes and mean varints.
  size_t at = 56 + C;
  for (int32_t m : d.mean_code[0]) {
    uint32_t z = (static_cast<uint32_t>(m) << 1) ^ static_cast<uint32_t>(m >> 31);
    for (++at; z >= 0x80; z >>= 7) ++at;
  }
  ASSERT_EQ(good[at], d.classes[0]);
  auto v = good;
  v[at] = 65;  // more classes than allowed
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[at + 1] = d.classes[0];  // a channel's class out of range
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
  v = good;
  v[4] = 3;  // version 3 does not know the classes flag
  EXPECT_EQ(Profile::Parse(Resealed(v)).status().code(), StatusCode::kCorrupt);
}

// A profile's tables are of one quantizer's symbols: encoding with the other
// is refused (it would silently cost rate); versions 1 and 2 do not say.
TEST(Profile, EncoderRefusesTheOtherQuantizer) {
  CodecConfig lloyd;
  lloyd.quantizer = CodecConfig::Quantizer::kLloyd;
  auto pl = Trained(lloyd), pu = Trained();
  ASSERT_TRUE(pl && pu);
  EXPECT_EQ(pl->data().tables_for, internal::ProfileData::TablesFor::kLloyd);
  EXPECT_EQ(pl->bytes()[6], 4);
  EXPECT_EQ(pl->quantizer(), CodecConfig::Quantizer::kLloyd);
  EXPECT_EQ(pu->quantizer(), CodecConfig::Quantizer::kUniform);
  const KVTensor kv = Contexts(3, 1)[0];
  auto encode = [&](std::shared_ptr<const Profile> p, CodecConfig::Quantizer q) {
    CodecConfig cfg;
    cfg.profile = std::move(p);
    cfg.quantizer = q;
    return Encoder::Create(cfg)->Encode(kv.view()).status();
  };
  EXPECT_TRUE(encode(pl, CodecConfig::Quantizer::kLloyd).ok());
  EXPECT_TRUE(encode(pu, CodecConfig::Quantizer::kUniform).ok());
  const Status wrong = encode(pl, CodecConfig::Quantizer::kUniform);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("--quantizer lloyd"), std::string::npos) << wrong.ToString();
  EXPECT_EQ(encode(pu, CodecConfig::Quantizer::kLloyd).code(), StatusCode::kInvalidArgument);
  auto legacy = Profile::Parse(AsVersion(pl->bytes(), 1, 0));
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ((*legacy)->quantizer(), std::nullopt);
  EXPECT_TRUE(encode(*legacy, CodecConfig::Quantizer::kUniform).ok());
  EXPECT_TRUE(encode(*legacy, CodecConfig::Quantizer::kLloyd).ok());
}

// With sensitivities, rate control gives the sensitive section finer steps
// (step ∝ 1/sqrt(w)) and still meets the bit target.
TEST(Profile, SensitivitiesSteerStepsAtTheBitTarget) {
  auto p = Trained();
  ASSERT_TRUE(p);
  // Section 2 (layer 1 K) 100x as sensitive: its step 10x finer than the others'.
  auto q = WithSensitivity(*p, {1, 1, 100, 1});
  ASSERT_TRUE(q);
  const KVTensor kv = Contexts(3, 1)[0];
  auto section_mse = [&](std::shared_ptr<const Profile> prof, double* bits) {
    CodecConfig cfg;
    cfg.bits_per_value = 2;
    cfg.profile = std::move(prof);
    auto bytes = Encoder::Create(cfg)->Encode(kv.view());
    EXPECT_TRUE(bytes.ok());
    *bits = double(bytes->size()) * 8 / double(kv.shape().values());
    const ProfileSet profiles(cfg.profile);
    auto out = Decoder::Open(*bytes, &profiles)->Decode(DType::kF32);
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
  const ProfileSet profiles(cfg.profile);
  auto dec = Decoder::Open(c.bytes, &profiles);
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
  const Coded plain = Code(kv, nullptr), with = Code(kv, p);
  EXPECT_LT(with.bytes.size() * 10, plain.bytes.size() * 9)
      << "with profile " << with.bytes.size() << " B, without " << plain.bytes.size() << " B";
  EXPECT_GT(with.snr_db, plain.snr_db - 3.0);

  // A profile not given to the decoder: the frames name it, decoding says so,
  // with no profiles or with others.
  CodecConfig other;
  other.group_tokens = 1;
  auto q = Trained(other);
  ASSERT_TRUE(q);
  ASSERT_NE(q->id(), p->id());
  CodecConfig cfg;
  cfg.profile = q;
  auto bytes = Encoder::Create(cfg)->Encode(kv.view());
  ASSERT_TRUE(bytes.ok());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(q->id()));
  ProfileSet profiles(p);
  const ProfileSet* const given_sets[] = {nullptr, &profiles};
  for (const ProfileSet* given : given_sets) {
    auto dec = Decoder::Open(*bytes, given);
    ASSERT_TRUE(dec.ok());
    auto out = dec->Decode(DType::kF32);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kNotFound);
    EXPECT_NE(out.status().message().find(hex), std::string::npos) << out.status().ToString();
  }
  profiles.Add(q);
  EXPECT_EQ(profiles.size(), 2u);
  EXPECT_EQ(profiles.Find(q->id()), q);
  EXPECT_TRUE(Decoder::Open(*bytes, &profiles)->Decode(DType::kF32).ok());
}

// Profile frames of small heads have short table-form streams, which the
// encoder writes with one rANS lane (decoded in lockstep groups): the scalar
// path and the SIMD one give the same bytes at every rate.
TEST(Profile, OneLaneStreamsDecodeTheSameOnScalarAndSimdPaths) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const ProfileSet profiles(p);
  const KVTensor kv = Contexts(3, 1)[0];
  for (double bits : {1.0, 2.0, 4.0}) {
    CodecConfig cfg;
    cfg.profile = p;
    cfg.bits_per_value = bits;
    auto bytes = Encoder::Create(cfg)->Encode(kv.view());
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto dec = Decoder::Open(*bytes, &profiles);
    ASSERT_TRUE(dec.ok());
    simd::SetEnabled(false);
    auto scalar = dec->Decode(DType::kF16);
    simd::SetEnabled(true);
    auto vec = dec->Decode(DType::kF16);
    ASSERT_TRUE(scalar.ok() && vec.ok());
    ASSERT_EQ(scalar->size_bytes(), vec->size_bytes());
    EXPECT_EQ(0, std::memcmp(scalar->data(), vec->data(), vec->size_bytes())) << bits << " bits/value";
  }
}

double SectionSnrDb(const KVTensor& kv, const KVTensor& out, uint32_t layer, KV k) {
  double p = 0, e = 0;
  const KVShape& s = kv.shape();
  for (uint32_t t = 0; t < s.tokens; ++t)
    for (uint32_t h = 0; h < s.kv_heads; ++h)
      for (uint32_t d = 0; d < s.head_dim; ++d) {
        const double x = kv.view().Get(layer, k, t, h, d), y = out.view().Get(layer, k, t, h, d);
        p += x * x;
        e += (x - y) * (x - y);
      }
  return 10 * std::log10(p / e);
}

// Sections whose data is far from the profile's statistics (here: 16 times
// smaller or larger than its training data) are coded with their own
// statistics, so they keep their quality; the encoder counts them. With the
// profile's statistics the small section would quantize to its mean.
TEST(Profile, SectionsUnlikeTheProfileUseTheirOwnStatistics) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const KVTensor like = Contexts(3, 1)[0];
  KVTensor unlike = Contexts(3, 1)[0];
  const KVShape& s = unlike.shape();
  std::vector<float> row(s.kv_heads * s.head_dim);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    unlike.view().ReadRow(0, KV::kValue, t, row.data());
    for (float& v : row) v /= 16;
    unlike.view().WriteRow(0, KV::kValue, t, row.data());
    unlike.view().ReadRow(1, KV::kKey, t, row.data());
    for (float& v : row) v *= 16;
    unlike.view().WriteRow(1, KV::kKey, t, row.data());
  }
  auto code = [&](const KVTensor& kv, std::shared_ptr<const Profile> profile, uint32_t* unlike_sections) {
    CodecConfig cfg;
    cfg.profile = std::move(profile);
    cfg.chunk_tokens = 32;
    EncodeStats stats;
    auto bytes = Encoder::Create(cfg)->Encode(kv.view(), &stats);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    *unlike_sections = 0;
    for (const FrameStats& fs : stats.frames) *unlike_sections += fs.sections_unlike_profile;
    const ProfileSet profiles(cfg.profile);
    auto out = Decoder::Open(*bytes, &profiles)->Decode(DType::kF32);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return std::move(out).value();
  };
  uint32_t n = 0;
  code(like, p, &n);
  EXPECT_EQ(n, 0u);  // held-out data of the profile's kind
  const KVTensor with = code(unlike, p, &n);
  EXPECT_EQ(n, 2u * (s.tokens / 32));  // V of layer 0 and K of layer 1, in every chunk
  const KVTensor without = code(unlike, nullptr, &n);
  EXPECT_EQ(n, 0u);
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV k : {KV::kKey, KV::kValue})
      EXPECT_GT(SectionSnrDb(unlike, with, l, k), SectionSnrDb(unlike, without, l, k) - 3)
          << "layer " << l << (k == KV::kKey ? " K" : " V");
}

// Rows are coded either Hadamard-rotated or in a profile's transform basis:
// a frame claiming both is corrupt (the encoder never writes one).
TEST(Profile, RotationWithHeadTransformsIsCorrupt) {
  auto p = Trained(CodecConfig{}, NoClasses());
  ASSERT_TRUE(p);
  const ProfileSet profiles(p);
  CodecConfig cfg;
  cfg.profile = p;
  auto frames = Encoder::Create(cfg)->EncodeChunk(Contexts(3, 1)[0].view(), 0, 0);
  ASSERT_TRUE(frames.ok()) << frames.status().ToString();
  auto parsed = ParseFrame(frames->at(0));
  ASSERT_TRUE(parsed.ok());
  std::vector<EncodedSection> sections;
  for (uint32_t l = 0; l < kShape.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue}) {
      auto payload = SectionPayload(*parsed, frames->at(0), l, kv);
      ASSERT_TRUE(payload.ok());
      sections.push_back({std::vector<uint8_t>(payload->begin(), payload->end())});
    }
  KVTensor out(kShape, DType::kF32);
  ASSERT_TRUE(DecodeFrame(WriteFrame(parsed->header, sections), out.view(), 1, &profiles).ok());
  FrameHeader h = parsed->header;
  h.params[1] |= 1;  // the rotation flag
  EXPECT_EQ(DecodeFrame(WriteFrame(h, sections), out.view(), 1, &profiles).code(), StatusCode::kCorrupt);
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

// The decoders' tables of a profile are built once per (section, grid point)
// and kept within the cache's budget, least recently used first out; tables
// a decode still holds stay valid after they leave the cache.
TEST(Profile, DecodeTablesAreCachedWithinABudget) {
  auto p = Trained();
  ASSERT_TRUE(p);
  const internal::ProfileData& d = p->data();
  const size_t one = d.decode_tables.Get(d, 0, 0)->bytes();
  internal::ProfileDecodeTables cache(2 * one);
  auto a = cache.Get(d, 0, 0);
  EXPECT_EQ(cache.Get(d, 0, 0), a);  // cached
  auto b = cache.Get(d, 0, 1);
  EXPECT_EQ(cache.bytes(), 2 * one);
  cache.Get(d, 0, 0);  // now b is the least recently used
  auto c = cache.Get(d, 0, 2);
  EXPECT_LE(cache.bytes(), 2 * one);
  EXPECT_EQ(cache.Get(d, 0, 0), a);
  EXPECT_NE(cache.Get(d, 0, 1), b);  // rebuilt: it had left
  EXPECT_EQ(b->symbols.size(), a->symbols.size());  // still whole while held
  const rans::FreqTable& f = d.Table(0, 1, 0, 0);
  for (uint32_t v = 0, slot = 0; v <= f.escape; slot += f.freq[v], ++v)
    EXPECT_EQ(b->symbols[0].entry[slot] & 0xff, v);
}

}  // namespace
}  // namespace cachegen
