// Baseline codecs: round-trip error bounds, exact rates, recency handling and
// hostile payloads (this suite runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "common/half.h"

namespace cachegen {
namespace {

struct Chunk {
  KVShape shape;
  uint32_t token_start = 0;
  uint32_t context_tokens = 0;
  std::vector<float> data;
  ChunkF32 View() const {
    ChunkF32 c;
    c.shape = shape;
    c.token_start = token_start;
    c.context_tokens = context_tokens;
    c.data = data;
    return c;
  }
  std::span<const float> Section(uint32_t layer, KV kv) const { return View().Section(layer, kv); }
};

// Random KV-like data: per-channel offsets and scales (keys have outlier
// channels), values f16-representable as real caches are.
Chunk MakeChunk(KVShape shape, uint32_t seed, uint32_t token_start = 0, uint32_t context_tokens = 1u << 30) {
  Chunk c;
  c.shape = shape;
  c.token_start = token_start;
  c.context_tokens = context_tokens;
  c.data.resize(shape.values());
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  const uint64_t C = shape.channels();
  std::vector<float> off(C), sc(C);
  for (uint64_t ch = 0; ch < C; ++ch) {
    off[ch] = n01(rng) * 2;
    sc[ch] = std::exp(n01(rng));
  }
  size_t i = 0;
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (uint32_t t = 0; t < shape.tokens; ++t)
        for (uint64_t ch = 0; ch < C; ++ch) c.data[i++] = RoundToF16(off[ch] + sc[ch] * n01(rng));
  return c;
}

const Codec& Get(const char* name) {
  auto r = CodecByName(name);
  EXPECT_TRUE(r.ok()) << name;
  return *r.value();
}

SectionContext Ctx(const Chunk& c, uint32_t layer, KV kv) {
  SectionContext ctx;
  ctx.shape = c.shape;
  ctx.layer = layer;
  ctx.kv = kv;
  ctx.token_start = c.token_start;
  ctx.context_tokens = c.context_tokens;
  return ctx;
}

struct Encoded {
  std::vector<EncodedSection> sections;
  std::vector<std::vector<float>> decoded;  // per section
};

Encoded RoundTrip(const Codec& codec, const Chunk& c) {
  Encoded e;
  auto r = codec.Encode(c.View(), CodecConfig{});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return e;
  EXPECT_EQ(r->size(), 1u);
  e.sections = (*r)[0].sections;
  EXPECT_EQ(e.sections.size(), size_t{c.shape.layers} * 2);
  for (size_t s = 0; s < e.sections.size(); ++s) {
    std::vector<float> out(uint64_t{c.shape.tokens} * c.shape.channels(), -12345.f);
    Status st = codec.DecodeSection(Ctx(c, s / 2, s % 2 ? KV::kValue : KV::kKey), e.sections[s].bytes, out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    e.decoded.push_back(std::move(out));
  }
  return e;
}

uint64_t TotalBytes(const Encoded& e) {
  uint64_t n = 0;
  for (auto& s : e.sections) n += s.bytes.size();
  return n;
}

double BitsPerValue(const Encoded& e, const Chunk& c) { return TotalBytes(e) * 8.0 / c.shape.values(); }

float F16At(const std::vector<uint8_t>& b, size_t off) {
  return F16ToF32(static_cast<uint16_t>(b[off] | (b[off + 1] << 8)));
}

// --- fp16-zstd -------------------------------------------------------------

TEST(Fp16Zstd, ExactF16RoundTrip) {
  Chunk c = MakeChunk({2, 2, 16, 37}, 1);
  for (float& x : c.data) x *= 1.001f;  // not f16-exact any more
  Encoded e = RoundTrip(Get("fp16-zstd"), c);
  for (uint32_t s = 0; s < 4; ++s) {
    auto in = c.Section(s / 2, s % 2 ? KV::kValue : KV::kKey);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(e.decoded[s][i], RoundToF16(in[i]));
    EXPECT_EQ(e.sections[s].side_bytes, 0u);
  }
}

TEST(Fp16Zstd, CompressesRedundantData) {
  Chunk c = MakeChunk({1, 2, 64, 256}, 2);
  std::fill(c.data.begin(), c.data.end(), 0.5f);
  Encoded e = RoundTrip(Get("fp16-zstd"), c);
  EXPECT_LT(TotalBytes(e), c.data.size() * 2 / 100);
}

// --- q8 / q4 ---------------------------------------------------------------

TEST(Q8, ExactRateAndHalfStepError) {
  Chunk c = MakeChunk({2, 2, 64, 50}, 3);
  Encoded e = RoundTrip(Get("q8"), c);
  EXPECT_DOUBLE_EQ(BitsPerValue(e, c), 8.5);
  const uint64_t C = c.shape.channels();
  for (uint32_t s = 0; s < 4; ++s) {
    auto in = c.Section(s / 2, s % 2 ? KV::kValue : KV::kKey);
    const auto& b = e.sections[s].bytes;
    EXPECT_EQ(e.sections[s].side_bytes, c.shape.tokens * (C / 32) * 2);
    for (uint32_t t = 0; t < c.shape.tokens; ++t)
      for (uint64_t blk = 0; blk < C / 32; ++blk) {
        const float d = F16At(b, (uint64_t{t} * (C / 32) + blk) * 34);
        float amax = 0;
        for (uint64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(in[t * C + blk * 32 + j]));
        EXPECT_GE(d * 127, amax);
        for (uint64_t j = 0; j < 32; ++j) {
          const uint64_t i = t * C + blk * 32 + j;
          ASSERT_LE(std::fabs(e.decoded[s][i] - in[i]), d / 2 * (1 + 1e-5f)) << i;
        }
      }
  }
}

TEST(Q8, ShortLastBlockAndZeros) {
  Chunk c = MakeChunk({1, 3, 7, 5}, 4);  // 21 channels: one 21-value block per row
  for (size_t i = 0; i < 21; ++i) c.data[i] = 0;  // an all-zero row
  Encoded e = RoundTrip(Get("q8"), c);
  EXPECT_EQ(e.sections[0].bytes.size(), 5u * (2 + 21));
  for (size_t i = 0; i < 21; ++i) EXPECT_EQ(e.decoded[0][i], 0.0f);
  auto in = c.Section(0, KV::kKey);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(e.decoded[0][i], in[i], 0.01f * 8);
  // 70 channels: blocks of 32, 32, 6.
  Chunk c2 = MakeChunk({1, 2, 35, 3}, 5);
  Encoded e2 = RoundTrip(Get("q8"), c2);
  EXPECT_EQ(e2.sections[1].bytes.size(), 3u * (3 * 2 + 70));
}

TEST(Q4, ExactRateAndErrorBound) {
  Chunk c = MakeChunk({2, 4, 32, 40}, 6);
  Encoded e = RoundTrip(Get("q4"), c);
  EXPECT_DOUBLE_EQ(BitsPerValue(e, c), 4.5);
  const uint64_t C = c.shape.channels();
  for (uint32_t s = 0; s < 4; ++s) {
    auto in = c.Section(s / 2, s % 2 ? KV::kValue : KV::kKey);
    const auto& b = e.sections[s].bytes;
    for (uint32_t t = 0; t < c.shape.tokens; ++t)
      for (uint64_t blk = 0; blk < C / 32; ++blk) {
        const float d = F16At(b, (uint64_t{t} * (C / 32) + blk) * 18);
        for (uint64_t j = 0; j < 32; ++j) {
          const uint64_t i = t * C + blk * 32 + j;
          const float err = std::fabs(e.decoded[s][i] - in[i]);
          const float r = d != 0 ? in[i] / d : 0;
          // Half a step, except the clamped top code (x / d > 7.5): one step.
          ASSERT_LE(err, std::fabs(d) * (r > 7.5f ? 1.0f : 0.5f) * (1 + 1e-5f)) << i;
        }
      }
  }
}

TEST(Q4, MaxMagnitudeValueMapsToCodeZero) {
  Chunk c;
  c.shape = {1, 1, 32, 1};
  c.data.assign(64, 0.25f);
  c.data[5] = -3.0f;  // max magnitude, negative: d = 3/8 > 0
  c.data[32 + 9] = 4.0f;  // positive max: d = -0.5
  Encoded e = RoundTrip(Get("q4"), c);
  EXPECT_FLOAT_EQ(F16At(e.sections[0].bytes, 0), 0.375f);
  EXPECT_FLOAT_EQ(F16At(e.sections[1].bytes, 0), -0.5f);
  EXPECT_EQ(e.decoded[0][5], -3.0f);
  EXPECT_EQ(e.decoded[1][9], 4.0f);
  EXPECT_EQ((e.sections[0].bytes[2 + 2] >> 4) & 0xf, 0);  // code 5: byte 2, high nibble
}

TEST(Q4, OddShortBlock) {
  Chunk c = MakeChunk({1, 1, 45, 3}, 7);  // blocks of 32 and 13
  Encoded e = RoundTrip(Get("q4"), c);
  EXPECT_EQ(e.sections[0].bytes.size(), 3u * (2 + 16 + 2 + 7));
  auto in = c.Section(0, KV::kValue);
  float amax = 0;
  for (float x : in) amax = std::max(amax, std::fabs(x));
  for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(e.decoded[1][i], in[i], amax / 8 * 1.01f);
}

// --- kivi --------------------------------------------------------------------

// Error of every quantized value within half the step stored for its group.
void CheckKiviGroups(const Chunk& c, const Encoded& e, uint32_t r) {
  const uint64_t C = c.shape.channels();
  for (uint32_t s = 0; s < e.sections.size(); ++s) {
    const KV kv = s % 2 ? KV::kValue : KV::kKey;
    auto in = c.Section(s / 2, kv);
    const auto& b = e.sections[s].bytes;
    for (uint64_t t = 0; t < c.shape.tokens; ++t)
      for (uint64_t ch = 0; ch < C; ++ch) {
        const uint64_t i = t * C + ch;
        bool quantized;
        uint64_t param;
        if (kv == KV::kKey) {
          quantized = t < r / 32 * 32;
          param = (t / 32) * C + ch;
        } else {
          quantized = t < r;
          param = t * ((C + 31) / 32) + ch / 32;
        }
        if (!quantized) {
          ASSERT_EQ(e.decoded[s][i], RoundToF16(in[i])) << "s=" << s << " t=" << t;
          continue;
        }
        const float step = F16At(b, param * 4 + 2);
        ASSERT_LE(std::fabs(e.decoded[s][i] - in[i]), step / 2 * (1 + 1e-4f) + 1e-6f)
            << "s=" << s << " t=" << t << " ch=" << ch;
      }
  }
}

TEST(Kivi, ExactRateWithoutRecentTokens) {
  for (uint32_t bits : {2u, 4u}) {
    Chunk c = MakeChunk({2, 2, 32, 96}, 8, /*token_start=*/0, /*context_tokens=*/5000);
    Encoded e = RoundTrip(Get(bits == 2 ? "kivi2" : "kivi4"), c);
    EXPECT_DOUBLE_EQ(BitsPerValue(e, c), bits + 1.0) << bits;
    for (auto& s : e.sections) EXPECT_EQ(s.side_bytes * 8.0, s.bytes.size() * 8.0 / (bits + 1));
    CheckKiviGroups(c, e, 96);
  }
}

TEST(Kivi, RecentTokensAreExactF16) {
  // Context of 300 tokens; this chunk holds [44, 300): positions >= 172 are recent.
  Chunk c = MakeChunk({2, 2, 32, 256}, 9, 44, 300);
  for (const char* name : {"kivi2", "kivi4"}) {
    Encoded e = RoundTrip(Get(name), c);
    CheckKiviGroups(c, e, 128);
  }
  // Wholly recent chunk: everything f16, no side information.
  Chunk r = MakeChunk({1, 1, 32, 64}, 10, 200, 300);
  Encoded e = RoundTrip(Get("kivi2"), r);
  EXPECT_EQ(TotalBytes(e), r.data.size() * 2);
  EXPECT_EQ(e.sections[0].side_bytes, 0u);
  CheckKiviGroups(r, e, 0);
}

TEST(Kivi, IncompleteKeyGroupKeptInF16) {
  // 100 non-recent tokens: keys 3 groups + 4 residual tokens f16; values all quantized.
  Chunk c = MakeChunk({1, 3, 7, 100}, 11, 0, 100000);  // 21 channels: a short value group
  Encoded e = RoundTrip(Get("kivi2"), c);
  CheckKiviGroups(c, e, 100);
  const uint64_t C = 21;
  EXPECT_EQ(e.sections[0].bytes.size(), 3 * C * 4 + (96 * C * 2 + 7) / 8 + 4 * C * 2);
  EXPECT_EQ(e.sections[1].bytes.size(), 100 * 4 + (100 * C * 2 + 7) / 8);
}

TEST(Kivi, ConstantGroupsAreExact) {
  Chunk c = MakeChunk({1, 1, 32, 64}, 12, 0, 100000);
  std::fill(c.data.begin(), c.data.end(), 1.5f);
  Encoded e = RoundTrip(Get("kivi4"), c);
  for (auto& d : e.decoded)
    for (float x : d) ASSERT_EQ(x, 1.5f);
}

// --- hostile payloads --------------------------------------------------------

TEST(Baselines, HostilePayloadsNeverCrash) {
  std::mt19937 rng(13);
  for (const char* name : {"fp16-zstd", "q8", "q4", "kivi2", "kivi4"}) {
    const Codec& codec = Get(name);
    Chunk c = MakeChunk({1, 2, 16, 70}, 14, 0, 150);
    auto r = codec.Encode(c.View(), CodecConfig{});
    ASSERT_TRUE(r.ok());
    for (uint32_t s = 0; s < 2; ++s) {
      const auto& good = (*r)[0].sections[s].bytes;
      SectionContext ctx = Ctx(c, 0, s ? KV::kValue : KV::kKey);
      std::vector<float> out(uint64_t{70} * 32);
      // Truncated and extended payloads are wrong sizes: always rejected.
      for (size_t n : {size_t{0}, size_t{1}, good.size() / 2, good.size() - 1}) {
        std::vector<uint8_t> p(good.begin(), good.begin() + std::min(n, good.size()));
        EXPECT_FALSE(codec.DecodeSection(ctx, p, out).ok()) << name << " n=" << n;
      }
      std::vector<uint8_t> longer = good;
      longer.push_back(0);
      EXPECT_FALSE(codec.DecodeSection(ctx, longer, out).ok()) << name;
      // Random bytes of the right and wrong lengths, and bit flips: ok or not, no UB.
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<uint8_t> p(trial % 2 ? good.size() : rng() % (good.size() + 64));
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        (void)codec.DecodeSection(ctx, p, out);
        std::vector<uint8_t> f = good;
        f[rng() % f.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        (void)codec.DecodeSection(ctx, f, out);
      }
      // A context claiming a different recency split changes the expected size.
      if (name[0] == 'k') {
        SectionContext other = ctx;
        other.context_tokens = 1000;
        EXPECT_FALSE(codec.DecodeSection(other, good, out).ok()) << name;
      }
    }
  }
}

TEST(Baselines, RejectsNonFiniteInput) {
  for (const char* name : {"q8", "q4", "kivi2", "kivi4"}) {
    Chunk c = MakeChunk({1, 1, 32, 64}, 15, 0, 100000);
    c.data[7] = NAN;
    EXPECT_FALSE(Get(name).Encode(c.View(), CodecConfig{}).ok()) << name;
  }
}

// --- cachegen-ref ------------------------------------------------------------

uint32_t RefLevels(uint32_t layer, KV kv) {
  const uint32_t bins = kv == KV::kKey ? (layer < 10 ? 32 : 16) : (layer < 2 ? 32 : 16);
  return bins / 2 - 1;
}

TEST(CacheGenRef, ErrorBoundPerRowAndBinsPerLayer) {
  Chunk c = MakeChunk({12, 2, 32, 80}, 16);
  Encoded e = RoundTrip(Get("cachegen-ref"), c);
  const uint64_t C = c.shape.channels();
  for (uint32_t s = 0; s < e.sections.size(); ++s) {
    const uint32_t layer = s / 2;
    const KV kv = s % 2 ? KV::kValue : KV::kKey;
    const float M = static_cast<float>(RefLevels(layer, kv));
    auto in = c.Section(layer, kv);
    const auto& b = e.sections[s].bytes;
    EXPECT_GE(e.sections[s].side_bytes, c.shape.tokens * 2u);
    EXPECT_LT(e.sections[s].side_bytes, b.size());
    for (uint32_t t = 0; t < c.shape.tokens; ++t) {
      const float a = F16At(b, 2 * t);
      float amax = 0;
      for (uint64_t ch = 0; ch < C; ++ch) amax = std::max(amax, std::fabs(in[t * C + ch]));
      ASSERT_GE(a, amax);
      for (uint64_t ch = 0; ch < C; ++ch) {
        const uint64_t i = t * C + ch;
        ASSERT_LE(std::fabs(e.decoded[s][i] - in[i]), a / (2 * M) * (1 + 1e-4f)) << s << " " << i;
        // Reconstructions sit on the 2M+1 level grid.
        const float level = e.decoded[s][i] / a * M;
        ASSERT_NEAR(level, std::nearbyint(level), 1e-3f);
      }
    }
  }
  // Rate at a realistic chunk length (256 tokens): entropy-coded 31/15-level
  // symbols of Gaussian-like rows, plus per-channel tables.
  Chunk big = MakeChunk({12, 2, 64, 256}, 20);
  Encoded eb = RoundTrip(Get("cachegen-ref"), big);
  const double bpv = BitsPerValue(eb, big);
  std::printf("cachegen-ref: %.3f bits/value (T=80), %.3f bits/value (T=256)\n", BitsPerValue(e, c), bpv);
  EXPECT_GT(bpv, 1.0);
  EXPECT_LT(bpv, 5.0);
}

TEST(CacheGenRef, ConstantChannelsCostLittle) {
  Chunk c = MakeChunk({1, 2, 32, 256}, 17);
  for (size_t i = 0; i < c.data.size(); ++i) c.data[i] = (i % 64) < 32 ? 1.0f : -0.5f;
  Encoded e = RoundTrip(Get("cachegen-ref"), c);
  for (uint32_t s = 0; s < 2; ++s) {
    auto in = c.Section(0, s ? KV::kValue : KV::kKey);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_NEAR(e.decoded[s][i], in[i], 1.0f / 30 + 1e-6f);
  }
  EXPECT_LT(BitsPerValue(e, c), 1.0);
}

TEST(CacheGenRef, HostilePayloadsNeverCrash) {
  const Codec& codec = Get("cachegen-ref");
  Chunk c = MakeChunk({1, 2, 8, 40}, 18);
  auto r = codec.Encode(c.View(), CodecConfig{});
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(19);
  for (uint32_t s = 0; s < 2; ++s) {
    const auto& good = (*r)[0].sections[s].bytes;
    SectionContext ctx = Ctx(c, 0, s ? KV::kValue : KV::kKey);
    std::vector<float> out(40 * 16);
    for (size_t n = 0; n < good.size(); n += 1 + n / 8) {
      std::vector<uint8_t> p(good.begin(), good.begin() + n);
      EXPECT_FALSE(codec.DecodeSection(ctx, p, out).ok()) << n;
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    EXPECT_FALSE(codec.DecodeSection(ctx, longer, out).ok());
    // Layer 5 values use 16 bins: the 32-bin symbols of layer 0 may be out of range.
    (void)codec.DecodeSection(Ctx(c, 5, ctx.kv), good, out);
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<uint8_t> p(rng() % (good.size() + 64));
      for (auto& b : p) b = static_cast<uint8_t>(rng());
      (void)codec.DecodeSection(ctx, p, out);
      std::vector<uint8_t> f = good;
      f[rng() % f.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      (void)codec.DecodeSection(ctx, f, out);
    }
  }
}

}  // namespace
}  // namespace cachegen
