// The cachegen codec through the internal Codec interface: rate control,
// closed-loop prediction, error bounds, recent-token precision, hostile payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/section_coder.h"
#include "codec/codec.h"
#include "common/half.h"

namespace cachegen {
namespace {

// Correlated tokens (AR(1)), a few large-offset outlier channels in K.
std::vector<float> MakeChunk(const KVShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  const uint32_t C = s.channels();
  std::vector<float> data(s.values());
  for (uint32_t l = 0; l < s.layers; ++l)
    for (uint32_t kv = 0; kv < 2; ++kv) {
      float* sec = &data[(size_t{l} * 2 + kv) * s.tokens * C];
      for (uint32_t c = 0; c < C; ++c) {
        const bool outlier = kv == 0 && c % 17 == 3;
        const float scale = outlier ? 8.0f : 1.0f, offset = outlier ? 5.0f : 0.0f;
        float state = n01(rng);
        for (uint32_t t = 0; t < s.tokens; ++t) {
          state = 0.9f * state + 0.43f * n01(rng);
          sec[size_t{t} * C + c] = RoundToF16(offset + scale * state);
        }
      }
    }
  return data;
}

struct Decoded {
  std::vector<float> values;
  uint64_t bytes = 0;
};

Decoded EncodeDecode(const KVShape& s, const std::vector<float>& data, const CodecConfig& cfg, uint32_t level = 0,
                     uint32_t token_start = 0, uint32_t context_tokens = 0) {
  const Codec* codec = CodecByName("cachegen").value();
  ChunkF32 chunk{s, DType::kF16, token_start, context_tokens ? context_tokens : token_start + s.tokens, data};
  auto levels = codec->Encode(chunk, cfg);
  EXPECT_TRUE(levels.ok()) << levels.status().ToString();
  Decoded d;
  d.values.resize(data.size());
  const EncodedLevel& lv = levels->at(level);
  const size_t n = size_t{s.tokens} * s.channels();
  for (uint32_t i = 0; i < s.layers * 2; ++i) {
    SectionContext ctx{s, i / 2, i % 2 ? KV::kValue : KV::kKey, level, chunk.token_start, chunk.context_tokens,
                       lv.params};
    Status st = codec->DecodeSection(ctx, lv.sections[i].bytes, std::span<float>(&d.values[i * n], n));
    EXPECT_TRUE(st.ok()) << st.ToString();
    d.bytes += lv.sections[i].bytes.size();
  }
  return d;
}

double SnrDb(const std::vector<float>& a, const std::vector<float>& b) {
  double p = 0, e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    p += double(a[i]) * a[i];
    e += double(a[i] - b[i]) * (a[i] - b[i]);
  }
  return 10 * std::log10(p / e);
}

TEST(Hadamard, IsOrthonormalAndSelfInverse) {
  std::vector<float> v = {1, -2, 3, 0.5f, 7, 0, -1, 2}, w = v;
  HadamardInPlace(w.data(), 8);
  double n0 = 0, n1 = 0;
  for (size_t i = 0; i < 8; ++i) n0 += v[i] * v[i], n1 += w[i] * w[i];
  EXPECT_NEAR(n0, n1, 1e-4);
  HadamardInPlace(w.data(), 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(v[i], w[i], 1e-5);
}

TEST(CacheGenCodec, MeetsBitsTargetWithinTolerance) {
  const KVShape s{4, 2, 64, 256};
  const auto data = MakeChunk(s, 1);
  for (double bits : {1.0, 2.0, 4.0}) {
    CodecConfig cfg;
    cfg.bits_per_value = bits;
    cfg.threads = 1;
    const Decoded d = EncodeDecode(s, data, cfg);
    const double achieved = d.bytes * 8.0 / s.values();
    EXPECT_NEAR(achieved, bits, 0.08 * bits) << "target " << bits;
    EXPECT_GT(SnrDb(data, d.values), 3 * bits) << "target " << bits;
  }
}

// Every level of a chunk with enough sections that rate control's last
// corrections move a quarter of them: each level within 1 % of its target
// (section bytes plus the frame bytes rate control counts: 64 fixed and 24
// per section), with either quantizer.
TEST(CacheGenCodec, LevelsMeetTheirBitsTargetsWithinOnePercent) {
  const KVShape s{8, 2, 64, 256};
  const Codec* codec = CodecByName("cachegen").value();
  for (uint64_t seed : {1, 2})
    for (auto quantizer : {CodecConfig::Quantizer::kUniform, CodecConfig::Quantizer::kLloyd}) {
      const auto data = MakeChunk(s, seed);
      CodecConfig cfg;
      cfg.bits_per_value = 2;
      cfg.levels = 4;
      cfg.quantizer = quantizer;
      auto levels = codec->Encode(ChunkF32{s, DType::kF16, 0, s.tokens, data}, cfg);
      ASSERT_TRUE(levels.ok()) << levels.status().ToString();
      for (size_t lv = 0; lv < levels->size(); ++lv) {
        double bytes = 64 + 24.0 * s.layers * 2;
        for (const EncodedSection& sec : (*levels)[lv].sections) bytes += double(sec.bytes.size());
        const double target = 2 * std::pow(0.75, double(lv)), achieved = bytes * 8 / double(s.values());
        EXPECT_NEAR(achieved, target, 0.01 * target) << "seed " << seed << " level " << lv << " lloyd "
                                                     << (quantizer == CodecConfig::Quantizer::kLloyd);
      }
    }
}

TEST(CacheGenCodec, MoreBitsGiveHigherSnrAndLevelsDescend) {
  const KVShape s{2, 2, 32, 128};
  const auto data = MakeChunk(s, 2);
  CodecConfig cfg;
  cfg.bits_per_value = 4;
  cfg.levels = 4;
  double last_snr = 1e9;
  for (uint32_t level = 0; level < 4; ++level) {
    const double snr = SnrDb(data, EncodeDecode(s, data, cfg, level).values);
    EXPECT_LT(snr, last_snr) << level;
    last_snr = snr;
  }
}

TEST(CacheGenCodec, MaxRelativeErrorIsABound) {
  const KVShape s{2, 3, 16, 50};  // head_dim 16, 3 heads, token count not a multiple of G
  const auto data = MakeChunk(s, 3);
  CodecConfig cfg;
  cfg.max_rel_error = 0.05;
  const Decoded d = EncodeDecode(s, data, cfg);
  // Per channel the bound is relative to the stored channel scale (<= 1.05x sigma);
  // check against 1.1 x the channel's standard deviation.
  const uint32_t C = s.channels();
  for (uint32_t sec = 0; sec < s.layers * 2; ++sec)
    for (uint32_t c = 0; c < C; ++c) {
      double sum = 0, sq = 0;
      for (uint32_t t = 0; t < s.tokens; ++t) {
        const double v = data[(size_t{sec} * s.tokens + t) * C + c];
        sum += v, sq += v * v;
      }
      const double sd = std::sqrt(std::max(0.0, sq / s.tokens - (sum / s.tokens) * (sum / s.tokens)));
      for (uint32_t t = 0; t < s.tokens; ++t) {
        const size_t i = (size_t{sec} * s.tokens + t) * C + c;
        ASSERT_LE(std::abs(data[i] - d.values[i]), 0.05 * 1.1 * sd + 1e-6) << "sec " << sec << " c " << c;
      }
    }
}

TEST(CacheGenCodec, ClosedLoopDeltasDoNotDrift) {
  // Channels with a large per-channel level and small token-to-token noise:
  // delta prediction wins, and long groups would drift if deltas were taken
  // against the original rather than the reconstructed anchor.
  const KVShape s{1, 1, 32, 256};
  std::mt19937_64 rng(4);
  std::normal_distribution<float> n01(0, 1);
  std::vector<float> data(s.values());
  const uint32_t C = s.channels();
  for (uint32_t sec = 0; sec < 2; ++sec)
    for (uint32_t c = 0; c < C; ++c) {
      float level = 0;
      for (uint32_t t = 0; t < s.tokens; ++t) {
        if (t % 64 == 0) level = 3 * n01(rng);  // a new level per channel and group
        data[(size_t{sec} * s.tokens + t) * C + c] = RoundToF16(level + 0.05f * n01(rng));
      }
    }
  CodecConfig cfg;
  cfg.bits_per_value = 3;
  cfg.group_tokens = 64;
  const Codec* codec = CodecByName("cachegen").value();
  auto levels = codec->Encode(ChunkF32{s, DType::kF16, 0, s.tokens, data}, cfg);
  ASSERT_TRUE(levels.ok());
  ASSERT_EQ(levels->at(0).sections[0].bytes[0], 1) << "delta prediction expected on this data";
  const Decoded d = EncodeDecode(s, data, cfg);
  double first = 0, last = 0;
  for (uint32_t g = 0; g < 4; ++g)
    for (uint32_t c = 0; c < C; ++c) {
      for (uint32_t t : {g * 64 + 1, g * 64 + 2}) first += std::pow(data[t * C + c] - d.values[t * C + c], 2);
      for (uint32_t t : {g * 64 + 62, g * 64 + 63}) last += std::pow(data[t * C + c] - d.values[t * C + c], 2);
    }
  EXPECT_LT(last, 2.5 * first + 1e-9);
}

TEST(CacheGenCodec, RecentTokensExactOrFiner) {
  const KVShape s{2, 2, 16, 64};
  const auto data = MakeChunk(s, 5);
  CodecConfig cfg;
  cfg.bits_per_value = 2;
  cfg.recent_tokens = 20;
  cfg.recent_step_scale = 0;  // exact
  // Chunk covers tokens [100, 164) of a 170-token context: recent = positions >= 150 = chunk tokens 50..63.
  const Decoded d = EncodeDecode(s, data, cfg, 0, 100, 170);
  const uint32_t C = s.channels();
  for (uint32_t sec = 0; sec < s.layers * 2; ++sec)
    for (uint32_t t = 0; t < s.tokens; ++t)
      for (uint32_t c = 0; c < C; ++c) {
        const size_t i = (size_t{sec} * s.tokens + t) * C + c;
        if (t >= 50) {
          ASSERT_EQ(d.values[i], data[i]) << t;
        }
      }
  cfg.recent_step_scale = 0.25;
  const Decoded f = EncodeDecode(s, data, cfg, 0, 100, 170);
  double err_old = 0, err_new = 0;
  for (uint32_t sec = 0; sec < s.layers * 2; ++sec)
    for (uint32_t t = 0; t < s.tokens; ++t)
      for (uint32_t c = 0; c < C; ++c) {
        const size_t i = (size_t{sec} * s.tokens + t) * C + c;
        (t >= 50 ? err_new : err_old) += std::pow(data[i] - f.values[i], 2) / (t >= 50 ? 14 : 50);
      }
  EXPECT_LT(err_new, err_old);
}

TEST(CacheGenCodec, SnrTargetIsMet) {
  const KVShape s{3, 2, 32, 128};
  const auto data = MakeChunk(s, 6);
  CodecConfig cfg;
  cfg.snr_db = 20;
  const Decoded d = EncodeDecode(s, data, cfg);
  const double snr = SnrDb(data, d.values);
  EXPECT_GT(snr, 19.0);
  EXPECT_LT(snr, 23.0);
}

TEST(CacheGenCodec, HostilePayloadsFailCleanly) {
  const KVShape s{1, 2, 8, 24};
  const auto data = MakeChunk(s, 7);
  const Codec* codec = CodecByName("cachegen").value();
  CodecConfig cfg;
  cfg.bits_per_value = 3;
  ChunkF32 chunk{s, DType::kF16, 0, s.tokens, data};
  auto levels = codec->Encode(chunk, cfg);
  ASSERT_TRUE(levels.ok());
  const auto& lv = levels->at(0);
  const auto& good = lv.sections[0].bytes;
  std::vector<float> out(size_t{s.tokens} * s.channels());
  SectionContext ctx{s, 0, KV::kKey, 0, 0, s.tokens, lv.params};
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);
    EXPECT_FALSE(codec->DecodeSection(ctx, cut, out).ok()) << len;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x5a;
    (void)codec->DecodeSection(ctx, bad, out);  // must not crash or hang; checksums catch it in frames
  }
  // Params: a later version is unsupported whatever follows it (even too short
  // for version 1's fields); version 0 never existed.
  std::vector<uint8_t> bad_params = lv.params;
  bad_params[0] = 99;
  ctx.params = bad_params;
  EXPECT_EQ(codec->DecodeSection(ctx, good, out).code(), StatusCode::kUnsupported);
  const std::vector<uint8_t> short_later = {3, 0};
  ctx.params = short_later;
  EXPECT_EQ(codec->DecodeSection(ctx, good, out).code(), StatusCode::kUnsupported);
  bad_params[0] = 0;
  ctx.params = bad_params;
  EXPECT_EQ(codec->DecodeSection(ctx, good, out).code(), StatusCode::kCorrupt);
}

// One section of shape `s` with the learned quantizer, no recent window.
SectionLayout LloydLayout(const KVShape& s, uint32_t group_tokens) {
  SectionLayout l;
  l.tokens = s.tokens;
  l.kv_heads = s.kv_heads;
  l.head_dim = s.head_dim;
  l.group_tokens = group_tokens;
  l.recent_begin = s.tokens;
  l.lloyd = true;
  return l;
}

// Lloyd sections must decode to exactly the encoder's reconstruction, deltas
// included (closed loop against the reconstructed anchor with codebook levels).
TEST(CacheGenLloyd, DecoderReproducesEncoderReconstruction) {
  const KVShape s{1, 2, 16, 96};
  const auto data = MakeChunk(s, 11);
  const SectionLayout l = LloydLayout(s, 4);
  const size_t n = size_t{s.tokens} * s.channels();
  const std::span<const float> rows(data.data(), n);
  const SectionAnalysis a(l, rows);
  for (bool use_delta : {false, true})
    for (float step : {0.3f, 1.0f, 2.5f}) {
      std::vector<uint8_t> payload;
      uint32_t side = 0;
      a.Encode(step, use_delta, &payload, &side);
      // Fine steps may fall back to the uniform quantizer (no codebook pays off there).
      if (step > 1) {
        ASSERT_EQ(payload[0], (use_delta ? 1 : 0) | 8) << "codebook flag expected";
      }
      std::vector<float> out(n);
      ASSERT_TRUE(DecodeCacheGenSection(l, payload, out).ok());
      double err = 0;
      for (size_t i = 0; i < n; ++i) err += double(rows[i] - out[i]) * (rows[i] - out[i]);
      EXPECT_EQ(err / n, a.MeasureMse(step, use_delta)) << "step " << step << " delta " << use_delta;
      EXPECT_NEAR(double(payload.size()), a.EstimateBytes(step, use_delta, 1), 0.02 * payload.size() + 8);
    }
}

// Laplacian-distributed channels with different scales: the case a
// rate-constrained quantizer with centroid levels is expected to win.
std::vector<float> MakeLaplacianChunk(const KVShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> e(1.0f);
  std::vector<float> data(s.values());
  const uint32_t C = s.channels();
  for (size_t i = 0; i < data.size(); ++i) {
    const float scale = 0.5f + float(i % C % 5);
    data[i] = RoundToF16((rng() & 1 ? 1.0f : -1.0f) * e(rng) * scale);
  }
  return data;
}

// K sections (where the codec uses the learned quantizer) at equal bits:
// SNR at least the uniform quantizer's, corrected by 6.02 dB per bit of rate
// difference.
TEST(CacheGenLloyd, KeySnrAtEqualBitsNotBelowUniform) {
  const KVShape s{2, 4, 32, 256};
  const size_t n = size_t{s.tokens} * s.channels();
  for (int kind = 0; kind < 2; ++kind) {
    const auto data = kind ? MakeLaplacianChunk(s, 3) : MakeChunk(s, 3);
    for (double bits : {1.5, 2.0, 3.0}) {
      double score[2], rate[2];
      for (int lloyd = 0; lloyd < 2; ++lloyd) {
        CodecConfig cfg;
        cfg.bits_per_value = bits;
        cfg.quantizer = lloyd ? CodecConfig::Quantizer::kLloyd : CodecConfig::Quantizer::kUniform;
        const Decoded d = EncodeDecode(s, data, cfg);
        double p = 0, e = 0;
        for (uint32_t layer = 0; layer < s.layers; ++layer)
          for (size_t i = 2 * layer * n; i < (2 * layer + 1) * n; ++i) {
            p += double(data[i]) * data[i];
            e += double(data[i] - d.values[i]) * (data[i] - d.values[i]);
          }
        rate[lloyd] = d.bytes * 8.0 / s.values();
        score[lloyd] = 10 * std::log10(p / e) - 6.02 * rate[lloyd];
      }
      EXPECT_GE(score[1], score[0] - 0.05) << (kind ? "laplace" : "ar1") << " at " << bits << " bits (" << rate[0]
                                           << " vs " << rate[1] << " b/v)";
    }
  }
}

// Hostile codebook fields fail with clean errors.
TEST(CacheGenLloyd, CorruptCodebookFailsCleanly) {
  const KVShape s{1, 2, 8, 96};
  const auto data = MakeChunk(s, 11);
  const SectionLayout l = LloydLayout(s, 1);
  const size_t n = size_t{s.tokens} * s.channels();
  const SectionAnalysis a(l, std::span<const float>(data.data(), n));
  std::vector<uint8_t> good;
  uint32_t side = 0;
  a.Encode(2.5f, false, &good, &side);
  ASSERT_EQ(good[0], 8);
  std::vector<float> out(n);
  ASSERT_TRUE(DecodeCacheGenSection(l, good, out).ok());
  // The codebook starts after flags, step, C scale codes and C mean varints.
  size_t pos = 5 + s.channels();
  for (uint32_t c = 0; c < s.channels(); ++c)
    while (good[pos++] & 0x80) {
    }
  const uint8_t levels = good[pos];
  ASSERT_GE(levels, 1);
  ASSERT_LE(levels, 16);
  ASSERT_EQ(good[pos + 1], s.head_dim) << "one codebook per head";
  auto expect_error = [&](std::vector<uint8_t> bad, const char* what) {
    const Status st = DecodeCacheGenSection(l, bad, out);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << what;
    EXPECT_NE(st.message().find("codebook"), std::string::npos) << what << ": " << st.message();
  };
  for (uint8_t m : {0, 17, 255}) {
    auto bad = good;
    bad[pos] = m;
    expect_error(bad, "levels");
  }
  for (uint8_t g : {0, 17, 200}) {
    auto bad = good;
    bad[pos + 1] = g;
    expect_error(bad, "group");
  }
  for (size_t len = pos; len < pos + 2 + 2 * levels; ++len)
    expect_error(std::vector<uint8_t>(good.begin(), good.begin() + len), "truncated");
  // One codebook per channel instead of per head: the offsets run into the
  // streams; must not crash (checks later catch it).
  auto bad = good;
  bad[pos + 1] = 1;
  (void)DecodeCacheGenSection(l, bad, out);
  // Any offset bytes decode (levels stay finite); flipping them changes values only.
  for (size_t i = pos + 2; i < pos + 2 + 2 * levels; ++i) {
    auto b = good;
    b[i] ^= 0x80;
    EXPECT_TRUE(DecodeCacheGenSection(l, b, out).ok());
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
  }
  // Unknown section flag bits stay corrupt.
  auto f = good;
  f[0] |= 16;
  EXPECT_EQ(DecodeCacheGenSection(l, f, out).code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace cachegen
