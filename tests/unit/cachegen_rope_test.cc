// RoPE-aware keys in the cachegen codec (src/codec/cachegen/rope.h,
// CodecConfig::rope, FORMAT.md "RoPE block").
#include "codec/cachegen/rope.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "codec/codec.h"
#include "common/half.h"

namespace cachegen {
namespace {

RopeConfig Rope(RopeConfig::Kind kind, uint32_t dims, double base = 10000.0) {
  RopeConfig r;
  r.kind = kind;
  r.dims = dims;
  r.freq_base = base;
  return r;
}

TEST(RopeTable, InverseUndoesForwardAndPastDimsAreUntouched) {
  for (auto kind : {RopeConfig::Kind::kNormal, RopeConfig::Kind::kNeox}) {
    const RopeTable table(Rope(kind, 6), 1000, 3);
    float x[8] = {1, -2, 3, 0.5f, -1, 2, 7, -7};
    float y[8];
    std::copy(x, x + 8, y);
    table.Apply(2, y, false);
    EXPECT_NE(y[0], x[0]);
    EXPECT_EQ(y[6], x[6]);
    EXPECT_EQ(y[7], x[7]);
    table.Apply(2, y, true);
    for (int d = 0; d < 8; ++d) EXPECT_NEAR(y[d], x[d], 1e-5) << d;
  }
}

TEST(RopeTable, NormalRotatesAdjacentPairsNeoxHalves) {
  // Position token_start + t = 3; pair 0: theta 3, pair 1: theta 3 * 100^(-1/2) = 0.3.
  const RopeTable normal(Rope(RopeConfig::Kind::kNormal, 4, 100.0), 2, 2);
  float x[4] = {1, 0, 1, 0};
  normal.Apply(1, x, false);
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(3.0), 1e-6);
  EXPECT_NEAR(x[2], std::cos(0.3), 1e-6);
  EXPECT_NEAR(x[3], std::sin(0.3), 1e-6);
  const RopeTable neox(Rope(RopeConfig::Kind::kNeox, 4, 100.0), 3, 1);
  float z[4] = {1, 1, 0, 0};
  neox.Apply(0, z, false);
  EXPECT_NEAR(z[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(z[2], std::sin(3.0), 1e-6);
  EXPECT_NEAR(z[1], std::cos(0.3), 1e-6);
  EXPECT_NEAR(z[3], std::sin(0.3), 1e-6);
}

// The per-thread table cut from one of positions from 0 holds exactly the
// angles computed for the frame directly, for frames at any position (past
// the cached range too) and after a change of RoPE settings.
TEST(RopeTable, CachedTablesEqualDirectOnes) {
  RopeConfig a;
  a.kind = RopeConfig::Kind::kNormal;
  a.dims = 64;
  RopeConfig b = a;
  b.kind = RopeConfig::Kind::kNeox;
  b.freq_base = 500000;
  for (const RopeConfig& rope : {a, b, a})
    for (uint32_t start : {0u, 700u, 5000u, kRopeCachePositions - 256, kRopeCachePositions + 3}) {
      const RopeTable& cached = CachedRopeTable(rope, start, 256);
      const RopeTable direct(rope, start, 256);
      ASSERT_EQ(cached.token_start(), start);
      ASSERT_EQ(cached.cos(), direct.cos()) << start;
      ASSERT_EQ(cached.sin(), direct.sin()) << start;
    }
}

TEST(RopeTable, ValidateRejectsBadParameters) {
  EXPECT_TRUE(ValidateRope(RopeConfig{}, 8).ok());
  EXPECT_TRUE(ValidateRope(Rope(RopeConfig::Kind::kNormal, 8), 8).ok());
  EXPECT_FALSE(ValidateRope(Rope(RopeConfig::Kind::kNormal, 10), 8).ok());
  EXPECT_FALSE(ValidateRope(Rope(RopeConfig::Kind::kNormal, 3), 8).ok());
  EXPECT_FALSE(ValidateRope(Rope(RopeConfig::Kind::kNormal, 0), 8).ok());
  EXPECT_FALSE(ValidateRope(Rope(RopeConfig::Kind::kNeox, 8, 0.0), 8).ok());
  EXPECT_FALSE(ValidateRope(Rope(RopeConfig::Kind::kNeox, 8, NAN), 8).ok());
}

// Keys with large per-channel means that RoPE spins around (as in trained
// models), then rotated by position token_start + t; values plain noise.
std::vector<float> PostRopeChunk(const KVShape& s, uint32_t token_start, const RopeConfig& rope) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> n01(0, 1);
  const uint32_t C = s.channels();
  std::vector<float> data(s.values());
  const RopeTable table(rope, token_start, s.tokens);
  for (uint32_t l = 0; l < s.layers; ++l) {
    float* k = &data[size_t{l} * 2 * s.tokens * C];
    float* v = k + size_t{s.tokens} * C;
    for (uint32_t t = 0; t < s.tokens; ++t) {
      for (uint32_t c = 0; c < C; ++c) {
        k[size_t{t} * C + c] = 4.0f * std::cos(float(c)) + 0.3f * n01(rng);
        v[size_t{t} * C + c] = n01(rng);
      }
      for (uint32_t h = 0; h < s.kv_heads; ++h) table.Apply(t, &k[size_t{t} * C + size_t{h} * s.head_dim], false);
      for (uint32_t c = 0; c < C; ++c) k[size_t{t} * C + c] = RoundToF16(k[size_t{t} * C + c]);
    }
  }
  return data;
}

// Encodes one chunk, decodes every section; returns the K SNR in dB.
double KeySnr(const KVShape& s, const std::vector<float>& data, uint32_t token_start, const CodecConfig& cfg,
              std::vector<uint8_t>* params = nullptr) {
  const Codec* codec = CodecByName("cachegen").value();
  ChunkF32 chunk{s, DType::kF16, token_start, token_start + s.tokens, data};
  auto levels = codec->Encode(chunk, cfg);
  EXPECT_TRUE(levels.ok()) << levels.status().ToString();
  if (!levels.ok()) return 0;
  const EncodedLevel& lv = levels->at(0);
  if (params) *params = lv.params;
  const size_t n = size_t{s.tokens} * s.channels();
  double p = 0, e = 0;
  std::vector<float> out(n);
  for (uint32_t l = 0; l < s.layers; ++l) {
    SectionContext ctx{s, l, KV::kKey, 0, token_start, token_start + s.tokens, lv.params};
    Status st = codec->DecodeSection(ctx, lv.sections[2 * l].bytes, out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    const float* ref = &data[size_t{l} * 2 * n];
    for (size_t i = 0; i < n; ++i) {
      p += double(ref[i]) * ref[i];
      e += double(ref[i] - out[i]) * (ref[i] - out[i]);
    }
  }
  return 10 * std::log10(p / e);
}

TEST(CacheGenRope, UndoneKeysCodeBetterAndDecodeBackToPostRope) {
  const KVShape s{2, 2, 16, 96};
  const uint32_t token_start = 200;
  for (auto kind : {RopeConfig::Kind::kNormal, RopeConfig::Kind::kNeox}) {
    const RopeConfig rope = Rope(kind, 16);
    const auto data = PostRopeChunk(s, token_start, rope);
    CodecConfig cfg;
    cfg.bits_per_value = 3;
    std::vector<uint8_t> plain_params, rope_params;
    const double plain = KeySnr(s, data, token_start, cfg, &plain_params);
    cfg.rope = rope;
    const double roped = KeySnr(s, data, token_start, cfg, &rope_params);
    // Decoded keys are post-RoPE again (an SNR against the input), and with
    // the rotation undone the channel means are visible to the quantizer.
    EXPECT_GT(roped, plain + 3.0) << "plain " << plain << " dB, rope " << roped << " dB";
    EXPECT_GT(roped, 20.0);
    EXPECT_EQ(plain_params[0], 1);  // params version 1 without a RoPE block
    EXPECT_EQ(rope_params[0], 2);
    EXPECT_EQ(rope_params.size(), plain_params.size() + 13);
  }
}

// Every output dtype goes through the rotation (the fused f16 store included):
// f16 and bf16 outputs equal the f32 output rounded.
TEST(CacheGenRope, EveryOutputDtypeIsRotated) {
  const KVShape s{2, 2, 16, 80};
  const RopeConfig rope = Rope(RopeConfig::Kind::kNeox, 16);
  const auto data = PostRopeChunk(s, 0, rope);
  KVTensor in(s, DType::kF32);
  const size_t n = size_t{s.tokens} * s.channels();
  for (uint32_t l = 0; l < s.layers; ++l)
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t t = 0; t < s.tokens; ++t)
        in.view().WriteRow(l, kv ? KV::kValue : KV::kKey, t, &data[(size_t{l} * 2 + kv) * n + size_t{t} * s.channels()]);
  CodecConfig cfg;
  cfg.bits_per_value = 3;
  cfg.rope = rope;
  cfg.chunk_tokens = 32;
  auto enc = Encoder::Create(cfg);
  ASSERT_TRUE(enc.ok());
  auto bytes = enc->Encode(in.view());
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  auto f32 = dec->Decode(DType::kF32);
  auto f16 = dec->Decode(DType::kF16);
  auto bf16 = dec->Decode(DType::kBF16);
  ASSERT_TRUE(f32.ok() && f16.ok() && bf16.ok());
  double err = 0, pow = 0;
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const float x = f32->view().Get(l, kv, t, h, d);
            ASSERT_EQ(f16->view().Get(l, kv, t, h, d), RoundToF16(x)) << l << " " << t << " " << h << " " << d;
            const float ref = in.view().Get(l, kv, t, h, d);
            err += double(x - ref) * (x - ref);
            pow += double(ref) * ref;
          }
  EXPECT_GT(10 * std::log10(pow / err), 8.0);  // V at 3 bits with key_step_scale 0.4 is coarse
  (void)bf16;
}

TEST(CacheGenRope, WrongParametersCostQualityNotCorrectness) {
  const KVShape s{1, 2, 16, 64};
  const auto data = PostRopeChunk(s, 0, Rope(RopeConfig::Kind::kNormal, 16));
  CodecConfig cfg;
  cfg.bits_per_value = 4;
  cfg.rope = Rope(RopeConfig::Kind::kNeox, 8, 500000.0);
  EXPECT_GT(KeySnr(s, data, 0, cfg), 10.0);
  cfg.rope.dims = 18;  // more than the head dim
  const Codec* codec = CodecByName("cachegen").value();
  ChunkF32 chunk{s, DType::kF16, 0, s.tokens, data};
  EXPECT_EQ(codec->Encode(chunk, cfg).status().code(), StatusCode::kInvalidArgument);
}

TEST(CacheGenRope, HostileRopeBlocksAreRejected) {
  const KVShape s{1, 2, 16, 16};
  const auto data = PostRopeChunk(s, 0, Rope(RopeConfig::Kind::kNormal, 16));
  CodecConfig cfg;
  cfg.rope = Rope(RopeConfig::Kind::kNormal, 16);
  const Codec* codec = CodecByName("cachegen").value();
  ChunkF32 chunk{s, DType::kF16, 0, s.tokens, data};
  auto levels = codec->Encode(chunk, cfg);
  ASSERT_TRUE(levels.ok());
  const auto& lv = levels->at(0);
  std::vector<float> out(size_t{s.tokens} * s.channels());
  auto decode = [&](std::vector<uint8_t> params) {
    SectionContext ctx{s, 0, KV::kKey, 0, 0, s.tokens, params};
    return codec->DecodeSection(ctx, lv.sections[0].bytes, out).code();
  };
  EXPECT_EQ(decode(lv.params), StatusCode::kOk);
  // Layout: version, flags, G u32, W u32, r f32, kind u8, dims u32, base f32, scale f32.
  auto p = lv.params;
  p[0] = 3;
  EXPECT_EQ(decode(p), StatusCode::kUnsupported);
  p = lv.params;
  p[0] = 1;  // version 1 knows no RoPE flag
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
  p = lv.params;
  p[14] = 7;  // kind
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
  p = lv.params;
  p[15] = 17;  // dims odd
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
  p = lv.params;
  p[15] = 32;  // dims > head dim
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
  p = lv.params;
  p[22] = 0xff;  // base exponent bits: NaN
  p[21] = 0xff;
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
  for (size_t len = 0; len < lv.params.size(); ++len)
    EXPECT_EQ(decode(std::vector<uint8_t>(lv.params.begin(), lv.params.begin() + len)), StatusCode::kCorrupt) << len;
  p = lv.params;
  p.push_back(0);
  EXPECT_EQ(decode(p), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace cachegen
