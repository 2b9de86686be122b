#include "codec/cachegen/section_coder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "codec/cachegen/fused_decode.h"
#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/rans.h"
#include "common/bytes.h"
#include "common/convert.h"
#include "common/half.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen {
namespace {

// Channel scales are stored as u8 codes on a 1/8-octave grid: 2^((code-128)/8),
// 2^-16 .. 2^15.9. Coarse is fine: rate control scales every step anyway.
constexpr int kSigmaCodeBias = 128;
constexpr float kSigmaCodeSteps = 8.0f;
// Means are stored as integers in units of scale/4: the encoder uses the
// stored value, so its coarseness only costs a negligible offset.
constexpr float kMeanUnitsPerSigma = 4.0f;
// Quantized values are kept within +-2^30 so symbols fit 32 bits.
constexpr double kMaxAbsSymbol = double(1 << 30);

inline float SigmaFromCode(uint8_t code) { return std::exp2((int(code) - kSigmaCodeBias) / kSigmaCodeSteps); }

inline uint8_t SigmaCode(double sigma) {
  if (!(sigma > 0)) return 0;
  const double c = std::nearbyint(std::log2(sigma) * kSigmaCodeSteps) + kSigmaCodeBias;
  return static_cast<uint8_t>(std::clamp(c, 0.0, 255.0));
}

// Reconstruction codebooks (FORMAT.md): offsets in 1/128 of a step, at most
// 16 magnitudes.
constexpr float kCodebookUnit = 1.0f / 128;
constexpr uint32_t kMaxCodebookLevels = 16;

inline uint32_t ZigZag(int32_t q) { return (static_cast<uint32_t>(q) << 1) ^ static_cast<uint32_t>(q >> 31); }
inline int32_t UnZigZag(uint32_t u) { return static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1); }

// Rounds half away from zero. Only the encoder rounds, so the rounding rule is
// not part of the format; this form vectorizes, nearbyint does not.
inline int32_t QuantizeValue(float r, float inv_step) {
  // min/max rather than std::clamp: same values for finite input, and branch-free.
  const float v = std::min(std::max(r * inv_step, -float(kMaxAbsSymbol)), float(kMaxAbsSymbol));
  return static_cast<int32_t>(v + std::copysign(0.5f, v));
}

// Streams in table form (frames with a model profile) carrying under 1024
// bytes get one lane, the rest the default 8. Each lane ends with a 4-byte
// state; on stories260K's small heads (8 dims: streams of a few hundred bytes)
// one lane below 512 bytes moved ΔPPL = 1 % from 1.96 to ≈ 1.84 bits/value,
// and 1024 (with channel classes, whose sensitive K sections take streams
// beyond 512 bytes at 3 bits/value) moved mean KL = 1e-3 from ≈ 3.10 to ≈ 3.02
// bits/value (docs/EVAL.md).
// Frames without a profile keep 8 lanes everywhere: the CUDA decoder (which
// takes no profiles) runs a stream's lanes on the threads of a warp, and one
// lane made it 3-6x slower on short chunks (docs/GPU.md); the CPU's fused
// path needs 8 lanes too.
constexpr rans::EncodeOptions kTableFormOptions{.lanes = rans::kDefaultLanes, .single_lane_below_bytes = 1024};

// Streams of a section: per head an anchor stream, then (with deltas) a delta stream.
struct StreamCounts {
  uint32_t anchors = 0;  // tokens coded against the channel mean
  uint32_t deltas = 0;   // tokens coded against their group's anchor
};

// The profile tables a head's stream of `kind` is coded with at grid point
// g: one per channel (its class's) where the section has channel classes,
// else the head's table alone. Valid until the calling thread's next call.
const std::vector<const rans::FreqTable*>& StreamTables(const internal::ProfileData& prof, uint32_t section, int g,
                                                        uint32_t head, uint32_t kind) {
  thread_local std::vector<const rans::FreqTable*> cycle;
  const uint32_t D = prof.head_dim;
  cycle.clear();
  if (!prof.HasClasses(section)) {
    cycle.push_back(&prof.Table(section, g, head, kind));
    return cycle;
  }
  for (uint32_t d = 0; d < D; ++d) cycle.push_back(&prof.ChannelTable(section, g, kind, head * D + d));
  return cycle;
}

StreamCounts CountStreams(const SectionLayout& l, bool use_delta) {
  const uint32_t tq = l.quantized_tokens();
  if (!use_delta) return {tq, 0};
  const uint32_t anchors = (tq + l.group_tokens - 1) / l.group_tokens;
  return {anchors, tq - anchors};
}

// The per-token step multiplier: recent tokens may be finer.
inline float TokenStep(const SectionLayout& l, float step, uint32_t t) {
  return t >= l.recent_begin ? step * l.recent_step_scale : step;
}

size_t SideInfoBytes(const std::vector<int32_t>& mean_code, size_t channels) {
  std::vector<uint8_t> tmp;
  ByteWriter w(&tmp);
  for (int32_t m : mean_code) w.Varint(ZigZag(m));
  return 1 + 4 + channels + tmp.size();
}

}  // namespace

void ChannelCodes(double mean, double var, uint8_t* sigma_code, int32_t* mean_code) {
  *sigma_code = SigmaCode(std::sqrt(std::max(0.0, var)));
  const float unit = SigmaFromCode(*sigma_code) / kMeanUnitsPerSigma;
  *mean_code = static_cast<int32_t>(std::clamp(std::nearbyint(mean / unit), -kMaxAbsSymbol, kMaxAbsSymbol));
}

float MeanFromCode(int32_t mean_code, float sigma) { return static_cast<float>(mean_code) * (sigma / kMeanUnitsPerSigma); }

void Codebook::Levels(uint32_t group, uint32_t kind, float* y) const {
  const int8_t* o = &offsets[(size_t{group} * kinds + kind) * 2 * levels];
  y[0] = 0;
  for (uint32_t u = 1; u <= 2 * levels; ++u) y[u] = static_cast<float>(UnZigZag(u)) + float(o[u - 1]) * kCodebookUnit;
}

size_t Codebook::bytes(uint32_t channels) const {
  if (!levels) return 0;
  size_t varint = 1;
  for (uint32_t g = group_channels; g >= 0x80; g >>= 7) ++varint;
  return 1 + varint + size_t{groups(channels)} * kinds * 2 * levels;
}

namespace {

// Lloyd quantizer (encoder choices, FORMAT.md): the rate weight lambda in
// step^2 per bit is the slope of a uniform quantizer's D(R) at high rate,
// 2 ln 2 / 12; a magnitude gets codebook levels when at least
// kCodebookMinCount values use it; kLloydPasses assignment/centroid passes
// follow the first (plain rounding) pass.
constexpr float kLloydLambda = 0.1155f;
constexpr uint64_t kCodebookMinCount = 32;
constexpr int kLloydPasses = 2;

}  // namespace

// What one quantization pass saw: symbol counts per (head, kind) for the rate
// term, sums of the normalized residuals per (group, kind, symbol) for centroids.
struct SectionAnalysis::LloydStats {
  size_t bins = 0;  // 2M + 3; the last bin counts every larger symbol
  std::vector<uint64_t> hist;  // [head][kind][bins]
  std::vector<double> sum;     // [group][kind][2M + 1]
  std::vector<uint64_t> count;
  double distortion = 0;  // sum of squared errors in units of the step
  LloydStats(const Codebook& cb, uint32_t heads, uint32_t head_dim)
      : bins(2 * cb.levels + 3),
        hist(size_t{heads} * cb.kinds * bins),
        sum(size_t{cb.groups(heads * head_dim)} * cb.kinds * (2 * cb.levels + 1)),
        count(sum.size()) {}
  // Order-0 entropy of the symbols per (head, kind) stream, in bits (the
  // larger symbols share one bin: the same approximation for every pass).
  double EntropyBits() const {
    double bits = 0;
    for (size_t s0 = 0; s0 < hist.size(); s0 += bins) {
      uint64_t n = 0;
      for (size_t u = 0; u < bins; ++u) n += hist[s0 + u];
      for (size_t u = 0; u < bins; ++u)
        if (hist[s0 + u]) bits += double(hist[s0 + u]) * std::log2(double(n) / double(hist[s0 + u]));
    }
    return bits;
  }
};

void SectionAnalysis::QuantizeRowLloyd(const Codebook& cb, const float* row, const float* pred, const float* st,
                                       const float* inv, bool is_delta, int32_t* q, float* rec,
                                       LloydStats* stats) const {
  const uint32_t H = layout_.kv_heads, D = layout_.head_dim, M = cb.levels;
  const uint32_t kind = is_delta ? 1 : 0;
  std::array<float, 2 * kMaxCodebookLevels + 1> y;
  uint32_t y_group = ~0u;
  auto level = [&](int32_t qq) { return uint32_t(std::abs(qq)) <= M ? y[ZigZag(qq)] : static_cast<float>(qq); };
  for (uint32_t h = 0; h < H; ++h) {
    for (uint32_t d = 0; d < D; ++d) {
      const uint32_t c = h * D + d;
      const float* cost = cb.Cost(kind, c, h, H * D);
      const uint32_t group = c / cb.group_channels;
      if (group != y_group) cb.Levels(y_group = group, kind, y.data());
      const float r = row[c] - pred[c];
      int32_t best = QuantizeValue(r, inv[c]);
      const uint32_t a = static_cast<uint32_t>(std::abs(best));
      if (a <= M + 1) {
        // Nearest level by distortion plus lambda * bits, among the rounded
        // magnitude and its two neighbours.
        const float v = r * inv[c];
        const int32_t sign = v < 0 ? -1 : 1;
        float best_cost = INFINITY;
        for (uint32_t m = a > 0 ? a - 1 : 0; m <= std::min(a + 1, M + 1); ++m) {
          const int32_t qq = sign * int32_t(m);
          const float e = v - level(qq);
          const float j = e * e + cost[ZigZag(qq)];
          if (j < best_cost) best_cost = j, best = qq;
        }
      }
      q[c] = best;
      rec[c] = pred[c] + level(best) * st[c];
      if (stats) {
        const float e = r * inv[c] - level(best);
        stats->distortion += double(e) * e;
        const uint32_t u = ZigZag(best);
        ++stats->hist[(size_t{h} * cb.kinds + kind) * stats->bins + std::min<size_t>(u, stats->bins - 1)];
        if (u >= 1 && u <= 2 * M) {
          const size_t i = (size_t{group} * cb.kinds + kind) * (2 * M + 1) + u;
          stats->sum[i] += r * inv[c];
          ++stats->count[i];
        }
      }
    }
  }
}

Codebook SectionAnalysis::Learn(float step, bool use_delta, uint32_t sample_every) const {
  Codebook cb;
  if (!layout_.lloyd) return cb;
  const uint32_t H = layout_.kv_heads;
  const uint32_t C = layout_.channels();
  cb.group_channels = layout_.head_dim;  // one codebook per head (measured best, docs/EVAL.md)
  cb.kinds = use_delta ? 2 : 1;
  cb.levels = kMaxCodebookLevels;
  const internal::ProfileData* prof = layout_.profile;
  // (Profile training learns before its tables exist.)
  const int grid = prof && !prof->tables.empty() ? prof->GridIndex(step) : -1;
  auto pass = [&](const Codebook& c) {
    LloydStats stats(c, H, layout_.head_dim);
    Quantize<false>(step, use_delta, sample_every, [](bool, const uint32_t*, const float*, const float*) {}, &c,
                    &stats);
    return stats;
  };
  // Offsets at the centroids and the rate term of a pass's assignment
  // (st may have more levels than c).
  auto update = [&](Codebook& c, const LloydStats& st) {
    const uint32_t M = c.levels, sm = (uint32_t(st.bins) - 3) / 2;
    c.offsets.assign(size_t{c.groups(C)} * c.kinds * 2 * M, 0);
    for (size_t gk = 0; gk < size_t{c.groups(C)} * c.kinds; ++gk)
      for (uint32_t u = 1; u <= 2 * M; ++u) {
        const size_t i = gk * (2 * sm + 1) + u;
        if (st.count[i] == 0) continue;
        const double off = st.sum[i] / double(st.count[i]) - UnZigZag(u);
        c.offsets[gk * 2 * M + u - 1] = static_cast<int8_t>(std::clamp(std::nearbyint(off * 128), -128.0, 127.0));
      }
    // Per head, or per channel class where the profile's tables are per class.
    const bool classes = grid >= 0 && prof->HasClasses(layout_.section);
    const uint32_t units = grid >= 0 ? prof->TableUnits(layout_.section) : H;
    c.cost.assign(size_t{units} * c.kinds * (2 * M + 3), 0);
    if (classes) c.cost_unit = prof->class_of[layout_.section];
    for (uint32_t h = 0; h < units; ++h)
      for (uint32_t k = 0; k < c.kinds; ++k) {
        float* cost = &c.cost[(size_t{h} * c.kinds + k) * (2 * M + 3)];
        if (grid >= 0) {
          // The profile's table is what the stream will be coded with.
          const rans::FreqTable& t = prof->Table(layout_.section, grid, h, k);
          for (uint32_t u = 0; u < 2 * M + 3; ++u)
            cost[u] = kLloydLambda * (12 - std::log2(float(t.freq[std::min(u, t.escape)])) + (u >= t.escape ? 8 : 0));
          continue;
        }
        const uint64_t* hs = &st.hist[(size_t{h} * c.kinds + k) * st.bins];
        uint64_t n = 0;
        for (size_t u = 0; u < st.bins; ++u) n += hs[u];
        for (uint32_t u = 0; u < 2 * M + 3; ++u)
          cost[u] = kLloydLambda * std::log2((double(n) + 1) / (double(hs[u]) + 0.5));
      }
  };
  // First pass: plain rounding (no rate term, levels at q).
  cb.offsets.assign(size_t{cb.groups(C)} * cb.kinds * 2 * cb.levels, 0);
  cb.cost.assign(size_t{H} * cb.kinds * (2 * cb.levels + 3), 0);
  LloydStats st = pass(cb);
  // Magnitudes used often enough to estimate a centroid.
  uint32_t M = 1;
  for (uint32_t m = 1; m <= kMaxCodebookLevels; ++m) {
    uint64_t n = 0;
    for (size_t gk = 0; gk < size_t{cb.groups(C)} * cb.kinds; ++gk)
      n += st.count[gk * (2 * kMaxCodebookLevels + 1) + 2 * m - 1] + st.count[gk * (2 * kMaxCodebookLevels + 1) + 2 * m];
    if (n >= kCodebookMinCount) M = m;
  }
  cb.levels = M;
  const double j_uniform = st.distortion + kLloydLambda * st.EntropyBits();
  for (int it = 0; it < kLloydPasses; ++it) {
    update(cb, st);
    st = pass(cb);
  }
  update(cb, st);
  // Keep the codebook only when it lowers distortion + lambda * rate (side
  // bytes included) against plain rounding at this step: at high rates the
  // centroids sit near the bin centres and the codebook would be overhead.
  const double j_lloyd = st.distortion + kLloydLambda * (st.EntropyBits() + 8.0 * double(cb.bytes(C)));
  if (!(j_lloyd < j_uniform)) return Codebook{};
  return cb;
}

namespace {

// Adds each channel's sum and sum of squares over `tokens` rows of C floats,
// in double (means can be large against the spread). Compiled twice; the
// AVX2 clone is chosen at run time.
template <int kVariant>
__attribute__((always_inline)) inline void ChannelSumsImpl(const float* y, uint32_t tokens, uint32_t C, double* sum,
                                                           double* sum_sq) {
  for (uint32_t t = 0; t < tokens; ++t) {
    const float* row = y + size_t{t} * C;
    for (uint32_t c = 0; c < C; ++c) {
      const double v = row[c];
      sum[c] += v;
      sum_sq[c] += v * v;
    }
  }
}
void ChannelSumsScalar(const float* y, uint32_t tokens, uint32_t C, double* sum, double* sum_sq) {
  ChannelSumsImpl<0>(y, tokens, C, sum, sum_sq);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void ChannelSumsAvx2(const float* y, uint32_t tokens, uint32_t C, double* sum,
                                                     double* sum_sq) {
  ChannelSumsImpl<1>(y, tokens, C, sum, sum_sq);
}
#endif
void ChannelSums(const float* y, uint32_t tokens, uint32_t C, double* sum, double* sum_sq) {
#if defined(__x86_64__)
  if (simd::Avx2()) return ChannelSumsAvx2(y, tokens, C, sum, sum_sq);
#endif
  ChannelSumsScalar(y, tokens, C, sum, sum_sq);
}

// How far a section's data lies from a profile's statistics: per head, the
// mean over its channels of log2(RMS of x - profile mean / profile scale),
// each channel's term within +-kMaxChannelOctaves; the largest magnitude
// over the heads, in octaves. Near 0 on data like the profile's training
// data (channel weights move scales within a head but keep each head's
// geometric mean, FORMAT.md). An octave off is a bit per value spent where
// the profile's rate allocation did not mean it (too many, or too few: then
// values quantize to the profile's mean).
constexpr double kMaxChannelOctaves = 8;
double ProfileMisfitOctaves(const internal::ProfileData& prof, uint32_t section, uint32_t head_dim, uint32_t tokens,
                            std::span<const double> sum, std::span<const double> sum_sq) {
  const std::vector<uint8_t>& sigma_code = prof.sigma_code[section];
  const std::vector<int32_t>& mean_code = prof.mean_code[section];
  const double n = std::max<uint32_t>(1, tokens);
  double worst = 0;
  for (size_t c0 = 0; c0 < sum.size(); c0 += head_dim) {
    double octaves = 0;
    for (size_t c = c0; c < c0 + head_dim; ++c) {
      const double sigma = SigmaFromCode(sigma_code[c]), mu = MeanFromCode(mean_code[c], float(sigma));
      const double mean_sq = std::max(0.0, sum_sq[c] / n - 2 * mu * sum[c] / n + mu * mu);
      octaves += std::clamp(0.5 * std::log2(mean_sq / (sigma * sigma)), -kMaxChannelOctaves, kMaxChannelOctaves);
    }
    worst = std::max(worst, std::abs(octaves / head_dim));
  }
  return worst;
}

// One row through the uniform quantizer: sym[c] = ZigZag(QuantizeValue(row[c]
// - pred[c], inv[c])) and, when out is set, the reconstruction out[c] =
// pred[c] + q * st[c] (a multiply, then an add). out may not alias the inputs.
void QuantizeRowScalar(const float* row, const float* pred, const float* st, const float* inv, uint32_t n,
                       uint32_t* sym, float* out) {
  for (uint32_t c = 0; c < n; ++c) {
    const int32_t q = QuantizeValue(row[c] - pred[c], inv[c]);
    sym[c] = ZigZag(q);
    if (out) out[c] = pred[c] + static_cast<float>(q) * st[c];
  }
}
#if defined(__x86_64__)
// The same 8 values at a time, bit for bit: the clamp as QuantizeValue's
// std::min/std::max (maxps/minps with the bound first keep their NaN rule),
// copysign as a sign-bit or, truncating conversion.
__attribute__((target("avx2"))) void QuantizeRowAvx2(const float* row, const float* pred, const float* st,
                                                     const float* inv, uint32_t n, uint32_t* sym, float* out) {
  const __m256 hi = _mm256_set1_ps(float(kMaxAbsSymbol)), lo = _mm256_set1_ps(-float(kMaxAbsSymbol));
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  uint32_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 p = _mm256_loadu_ps(pred + c);
    const __m256 r = _mm256_sub_ps(_mm256_loadu_ps(row + c), p);
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(r, _mm256_loadu_ps(inv + c))));
    const __m256i q = _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), half)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sym + c),
                        _mm256_xor_si256(_mm256_slli_epi32(q, 1), _mm256_srai_epi32(q, 31)));
    if (out) _mm256_storeu_ps(out + c, _mm256_add_ps(p, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st + c))));
  }
  QuantizeRowScalar(row + c, pred + c, st + c, inv + c, n - c, sym + c, out ? out + c : nullptr);
}
#endif
void QuantizeRow(const float* row, const float* pred, const float* st, const float* inv, uint32_t n, uint32_t* sym,
                 float* out) {
#if defined(__x86_64__)
  if (simd::Avx2()) return QuantizeRowAvx2(row, pred, st, inv, n, sym, out);
#endif
  QuantizeRowScalar(row, pred, st, inv, n, sym, out);
}

}  // namespace

void SectionLayout::SetProfileTransform() {
  transform = transform_t = nullptr;
  if (!profile || !profile->HasTransform(section)) return;
  transform = profile->transform[section].data();
  transform_t = profile->transform_t[section].data();
}

SectionAnalysis::SectionAnalysis(const SectionLayout& layout, std::span<const float> rows) : layout_(layout) {
  const uint32_t C = layout.channels(), D = layout.head_dim, T = layout.tokens, tq = layout.quantized_tokens();
  // Unrotated rows are read where they are (the caller keeps them alive).
  rows_ = rows.first(size_t{tq} * C);
  exact_.assign(rows.begin() + size_t{tq} * C, rows.begin() + size_t{T} * C);
  if (layout.rotate) {
    y_.assign(rows_.begin(), rows_.end());
    for (uint32_t t = 0; t < tq; ++t)
      for (uint32_t h = 0; h < layout.kv_heads; ++h) HadamardInPlace(&y_[size_t{t} * C + size_t{h} * D], D);
    rows_ = y_;
  } else if (layout.transform) {
    y_.resize(rows_.size());
    for (uint32_t t = 0; t < tq; ++t)
      for (uint32_t h = 0; h < layout.kv_heads; ++h) {
        const size_t at = size_t{t} * C + size_t{h} * D;
        HeadToCoding(layout.transform + size_t{h} * D * D, &rows_[at], &y_[at], D);
      }
    rows_ = y_;
  }

  std::vector<double> sum(C, 0), sum_sq(C, 0);
  ChannelSums(rows_.data(), tq, C, sum.data(), sum_sq.data());
  // The rotation and transforms are orthonormal: the coded rows' power is the original's
  // (up to rounding).
  for (double v : sum_sq) signal_power_ += v;
  for (float v : exact_) signal_power_ += double(v) * v;
  signal_power_ /= std::max<size_t>(1, rows.size());
  sigma_code_.resize(C);
  mean_code_.resize(C);
  sigma_.resize(C);
  mean_.resize(C);
  // A section of data unlike the profile's keeps the transform but codes with its own statistics and tables.
  if (layout.profile && layout.profile_misfit_octaves > 0 && tq > 0 &&
      ProfileMisfitOctaves(*layout.profile, layout.section, D, tq, sum, sum_sq) > layout.profile_misfit_octaves)
    layout_.profile = nullptr;
  if (layout_.profile) {
    sigma_code_ = layout.profile->sigma_code[layout.section];
    mean_code_ = layout.profile->mean_code[layout.section];
    for (uint32_t c = 0; c < C; ++c) {
      sigma_[c] = SigmaFromCode(sigma_code_[c]);
      mean_[c] = MeanFromCode(mean_code_[c], sigma_[c]);
      mean_sigma_sq_ += double(sigma_[c]) * sigma_[c] / C;
    }
    side_info_bytes_ = 1 + 4;
    return;
  }
  for (uint32_t c = 0; c < C; ++c) {
    const double n = std::max<uint32_t>(1, tq);
    const double mu = sum[c] / n;
    ChannelCodes(mu, sum_sq[c] / n - mu * mu, &sigma_code_[c], &mean_code_[c]);
    sigma_[c] = SigmaFromCode(sigma_code_[c]);
    mean_[c] = MeanFromCode(mean_code_[c], sigma_[c]);
    mean_sigma_sq_ += double(sigma_[c]) * sigma_[c] / C;
  }
  side_info_bytes_ = SideInfoBytes(mean_code_, C);
}

// Calls visit(is_delta, sym, x, rec) once per quantized token row, in stream
// order (token groups, then tokens): sym holds the row's C zigzagged symbols,
// x the original (rotated) row and rec its reconstruction (nullptr unless
// kNeedRec). The per-row loops make no calls, so the compiler vectorizes them.
// With a codebook, rows go through QuantizeRowLloyd instead (its levels and
// rate term; stats, if given, collects what the pass saw).
template <bool kNeedRec, typename Visit>
void SectionAnalysis::Quantize(float step, bool use_delta, uint32_t sample_every, Visit&& visit, const Codebook* cb,
                               LloydStats* stats) const {
  const SectionLayout& l = layout_;
  const uint32_t C = l.channels(), tq = l.quantized_tokens();
  const uint32_t G = use_delta ? l.group_tokens : 1;
  std::vector<float> anchor(C), st(C), inv(C), rec(kNeedRec ? C : 0), lloyd_rec(cb ? C : 0);
  std::vector<int32_t> q(C);
  std::vector<uint32_t> sym(C);
  float st_for = -1;
  for (uint32_t g0 = 0, gi = 0; g0 < tq; g0 += G, ++gi) {
    if (sample_every > 1 && gi % sample_every != 0) continue;
    for (uint32_t t = g0; t < std::min(g0 + G, tq); ++t) {
      const float ts = TokenStep(l, step, t);
      if (ts != st_for) {
        for (uint32_t c = 0; c < C; ++c) {
          st[c] = sigma_[c] * ts;
          inv[c] = 1.0f / st[c];
        }
        st_for = ts;
      }
      const float* row = &rows_[size_t{t} * C];
      const bool is_delta = t != g0;
      const float* pred = is_delta ? anchor.data() : mean_.data();
      // An anchor's reconstruction is the prediction of its group's deltas.
      float* out = !is_delta ? anchor.data() : kNeedRec ? rec.data() : nullptr;
      if (cb && cb->levels) {
        if (!out) out = lloyd_rec.data();
        QuantizeRowLloyd(*cb, row, pred, st.data(), inv.data(), is_delta, q.data(), out, stats);
        for (uint32_t c = 0; c < C; ++c) sym[c] = ZigZag(q[c]);
      } else {
        QuantizeRow(row, pred, st.data(), inv.data(), C, sym.data(), out);
      }
      visit(is_delta, sym.data(), row, kNeedRec ? out : nullptr);
    }
  }
}

double SectionAnalysis::EstimateBytes(float step, bool use_delta, uint32_t sample_every) const {
  QuantizedSection q;
  QuantizeStreams(step, use_delta, sample_every, &q);
  return q.bytes;
}

double SectionAnalysis::FillStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q) const {
  const SectionLayout& l = layout_;
  const uint32_t H = l.kv_heads, D = l.head_dim, tq = l.quantized_tokens();
  const uint32_t G = use_delta ? l.group_tokens : 1;
  sample_every = std::max(1u, sample_every);
  q->step = step;
  q->use_delta = use_delta;
  q->sample_every = sample_every;
  q->cb = Learn(step, use_delta, sample_every);
  q->counts.clear();  // stale once the symbols change
  // Rows of each stream kind in the sampled groups (Quantize's order).
  size_t rows[2] = {0, 0};
  uint32_t groups = 0, sampled = 0;
  for (uint32_t g0 = 0; g0 < tq; g0 += G, ++groups) {
    if (groups % sample_every != 0) continue;
    ++sampled;
    ++rows[0];
    rows[1] += std::min(G, tq - g0) - 1;
  }
  q->begin.resize(size_t{2} * H + 1);
  size_t off = 0;
  for (uint32_t s = 0; s < 2 * H; ++s) {
    q->begin[s] = off;
    off += rows[s & 1] * D;
  }
  q->begin[2 * H] = off;
  if (q->capacity < off) {
    q->symbols.reset(new uint32_t[off]);  // not value-initialised: every symbol is written
    q->capacity = off;
  }
  size_t next[2] = {0, 0};
  Quantize<false>(
      step, use_delta, sample_every,
      [&](bool is_delta, const uint32_t* sym, const float*, const float*) {
        const size_t r = next[is_delta]++;
        for (uint32_t h = 0; h < H; ++h)
          std::memcpy(q->symbols.get() + q->begin[2 * h + is_delta] + r * D, sym + size_t{h} * D, D * sizeof(uint32_t));
      },
      &q->cb);
  return sampled ? double(groups) / sampled : 1.0;
}

void SectionAnalysis::QuantizeStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q) const {
  const double scale = FillStreams(step, use_delta, sample_every, q);
  const uint32_t H = layout_.kv_heads;
  const int g = layout_.profile ? layout_.profile->GridIndex(step) : -1;
  // A sample's counts are scaled up to the whole section before the estimate,
  // so per-stream costs (tables, flush bytes) are counted once, not scaled.
  // The counts are kept for Encode.
  double stream_bytes = g >= 0 ? 1 : 0;  // the grid point byte
  q->counts.resize(g >= 0 ? 0 : size_t{H} * 2);
  for (uint32_t s = 0; s < H * 2; ++s) {
    if ((s & 1) && !use_delta) continue;
    const std::span<const uint32_t> sym(q->symbols.get() + q->begin[s], q->begin[s + 1] - q->begin[s]);
    if (g >= 0) {
      const std::vector<const rans::FreqTable*>& cycle = StreamTables(*layout_.profile, layout_.section, g, s / 2, s & 1);
      stream_bytes += static_cast<double>(rans::EstimateStreamBytesWithTables(sym, cycle, scale, kTableFormOptions));
      continue;
    }
    rans::SymbolCounts& counts = q->counts[s];
    counts.fill(0);
    rans::CountSymbols(sym, counts);
    stream_bytes += static_cast<double>(rans::EstimateStreamBytes(sym, counts, scale));
  }
  q->bytes = stream_bytes + side_info_bytes_ + q->cb.bytes(layout_.channels()) + exact_.size() * 2.0;
}

bool SectionAnalysis::PreferDelta(float step, uint32_t sample_every) const {
  if (layout_.group_tokens <= 1) return false;
  return EstimateBytes(step, true, sample_every) < EstimateBytes(step, false, sample_every * layout_.group_tokens);
}

double SectionAnalysis::MeasureMse(float step, bool use_delta) const {
  const uint32_t C = layout_.channels();
  double err = 0;
  size_t n = 0;
  const Codebook cb = Learn(step, use_delta, 1);
  Quantize<true>(
      step, use_delta, 1,
      [&](bool, const uint32_t*, const float* x, const float* rec) {
        for (uint32_t c = 0; c < C; ++c) err += double(x[c] - rec[c]) * (x[c] - rec[c]);
        n += C;
      },
      &cb);
  for (float v : exact_) {
    const double e = v - RoundToF16(v);
    err += e * e;
  }
  n += exact_.size();
  return n ? err / n : 0;
}

void SectionAnalysis::Encode(float step, bool use_delta, std::vector<uint8_t>* out, uint32_t* side_bytes) const {
  QuantizedSection q;
  FillStreams(step, use_delta, 1, &q);
  Encode(q, out, side_bytes);
}

void SectionAnalysis::Encode(const QuantizedSection& q, std::vector<uint8_t>* out, uint32_t* side_bytes) const {
  const uint32_t H = layout_.kv_heads, C = layout_.channels();
  const float step = q.step;
  const bool use_delta = q.use_delta;
  const Codebook& cb = q.cb;
  out->reserve(out->size() + static_cast<size_t>(q.bytes * 1.01) + 64);
  ByteWriter w(out);
  const size_t start = w.size();
  const internal::ProfileData* prof = layout_.profile;
  const int g = prof ? prof->GridIndex(step) : -1;
  w.U8((use_delta ? kSectionDelta : 0) | (prof ? kSectionProfileStats : 0) | (g >= 0 ? kSectionProfileTables : 0) |
       (cb.levels ? kSectionCodebook : 0));
  w.F32(step);
  if (g >= 0) w.U8(static_cast<uint8_t>(g));
  if (!prof) {
    for (uint32_t c = 0; c < C; ++c) w.U8(sigma_code_[c]);
    for (uint32_t c = 0; c < C; ++c) w.Varint(ZigZag(mean_code_[c]));
  }
  if (cb.levels) {
    w.U8(static_cast<uint8_t>(cb.levels));
    w.Varint(cb.group_channels);
    for (int8_t o : cb.offsets) w.U8(static_cast<uint8_t>(o));
  }
  *side_bytes = static_cast<uint32_t>(w.size() - start);
  auto stream = [&](uint32_t h, uint32_t kind) {
    const size_t s = 2 * h + kind;
    const std::span<const uint32_t> sym(q.symbols.get() + q.begin[s], q.begin[s + 1] - q.begin[s]);
    if (g >= 0)
      return rans::EncodeStreamWithTables(sym, StreamTables(*prof, layout_.section, g, h, kind), w, kTableFormOptions);
    return q.counts.size() > s ? rans::EncodeStream(sym, q.counts[s], w) : rans::EncodeStream(sym, w);
  };
  for (uint32_t h = 0; h < H; ++h) {
    *side_bytes += static_cast<uint32_t>(stream(h, 0));
    if (use_delta) *side_bytes += static_cast<uint32_t>(stream(h, 1));
  }
  for (float v : exact_) w.U16(F32ToF16(v));
}

void SectionAnalysis::Histograms(float step, bool use_delta, size_t bins, std::vector<uint64_t>* hist,
                                 uint32_t sample_every, bool per_channel) const {
  QuantizedSection q;
  FillStreams(step, use_delta, sample_every, &q);
  const uint32_t D = per_channel ? layout_.head_dim : 1;
  hist->assign(size_t{layout_.kv_heads} * 2 * D * bins, 0);
  for (size_t s = 0; s + 1 < q.begin.size(); ++s) {
    if (!per_channel) {
      rans::CountSymbols({q.symbols.get() + q.begin[s], q.begin[s + 1] - q.begin[s]}, {hist->data() + s * bins, bins});
      continue;
    }
    for (size_t i = q.begin[s], d = 0; i < q.begin[s + 1]; ++i, d = d + 1 == D ? 0 : d + 1)
      ++(*hist)[(s * D + d) * bins + std::min<size_t>(q.symbols[i], bins - 1)];
  }
}

namespace {

// Dequantization: out[d] = pred[d] + float(UnZigZag(sym[d])) * st[d], in
// exactly that float arithmetic (a multiply, then an add: no FMA).
void DequantScalar(const uint32_t* sym, const float* pred, const float* st, float* out, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) out[d] = pred[d] + static_cast<float>(UnZigZag(sym[d])) * st[d];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void DequantAvx2(const uint32_t* sym, const float* pred, const float* st, float* out,
                                                 uint32_t n) {
  uint32_t d = 0;
  const __m256i one = _mm256_set1_epi32(1);
  for (; d + 8 <= n; d += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sym + d));
    const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(u, 1), _mm256_sub_epi32(_mm256_setzero_si256(),
                                                                                 _mm256_and_si256(u, one)));
    const __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st + d));
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_loadu_ps(pred + d), prod));
  }
  DequantScalar(sym + d, pred + d, st + d, out + d, n - d);
}

// Dequantization fused with the f16 store (no rotation, f16 output with
// contiguous dims): dst[d] = f16(pred[d] + q * st[d]); keep (if not null)
// receives the f32 values. Same values as DequantAvx2 + StoreRow(kF16): F16C
// rounds like F32ToF16 except for NaN payloads, which go through StoreRow.
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 Dequant8Avx2(const uint32_t* sym, const float* pred,
                                                                                const float* st) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sym));
  const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(u, 1),
                                     _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(u, _mm256_set1_epi32(1))));
  return _mm256_add_ps(_mm256_loadu_ps(pred), _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st)));
}

__attribute__((target("avx2,f16c"))) void DequantF16Avx2(const uint32_t* sym, const float* pred, const float* st,
                                                         float* keep, uint8_t* dst, uint32_t n) {
  const size_t n8 = n & ~size_t{7};
  __m256 nan = _mm256_setzero_ps();
  if (keep) {
    for (size_t d = 0; d < n8; d += 8) {
      const __m256 v = Dequant8Avx2(sym + d, pred + d, st + d);
      _mm256_storeu_ps(keep + d, v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  } else {
    for (size_t d = 0; d < n8; d += 8) {
      const __m256 v = Dequant8Avx2(sym + d, pred + d, st + d);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  // A NaN (only from hostile or overflowing input) redoes the 8-value blocks
  // through StoreRow, which keeps F32ToF16's NaN encoding.
  const bool any_nan = !_mm256_testz_ps(nan, nan);
  for (size_t d = any_nan ? 0 : n8; d < n; d += 8) {
    const uint32_t m = static_cast<uint32_t>(std::min<size_t>(8, n - d));
    float tmp[8];
    DequantScalar(sym + d, pred + d, st + d, tmp, m);
    if (keep && d >= n8) std::memcpy(keep + d, tmp, m * sizeof(float));
    StoreRow(DType::kF16, tmp, m, dst + 2 * d);
  }
}
#endif

using DequantFn = void (*)(const uint32_t*, const float*, const float*, float*, uint32_t);

// A decoded codebook's levels: table (group, kind) at levels + (group * kinds + kind) * (top + 1).
struct LevelTables {
  const float* levels = nullptr;
  uint32_t top = 0;  // 2M: symbols u <= top have a level
  uint32_t kinds = 1, group_channels = 1;
};

// Dequantization with a codebook for channels c0.. of stream kind `kind`:
// symbols u <= top take their group's level y[u], larger ones
// q = UnZigZag(u) as in DequantScalar; out[d] = pred[d] + level * st[d].
void DequantLevels(const LevelTables& lt, uint32_t kind, uint32_t c0, const uint32_t* sym, const float* pred,
                   const float* st, float* out, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) {
    const float* y = lt.levels + (size_t{(c0 + d) / lt.group_channels} * lt.kinds + kind) * (lt.top + 1);
    const uint32_t u = sym[d];
    const float v = u <= lt.top ? y[u] : static_cast<float>(UnZigZag(u));
    out[d] = pred[d] + v * st[d];
  }
}

// Reads and validates a section's codebook (FORMAT.md "Reconstruction codebook").
Status ReadCodebook(ByteReader& r, uint32_t channels, bool use_delta, Codebook* cb) {
  cb->levels = r.U8();
  const uint64_t g = r.Varint();
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated codebook");
  if (cb->levels == 0 || cb->levels > kMaxCodebookLevels)
    return Status::Corrupt("cachegen section: codebook levels " + std::to_string(cb->levels) + " not in 1..16");
  if (g == 0 || g > channels)
    return Status::Corrupt("cachegen section: codebook group of " + std::to_string(g) + " channels not in 1..C");
  cb->group_channels = static_cast<uint32_t>(g);
  cb->kinds = use_delta ? 2 : 1;
  const size_t n = size_t{cb->groups(channels)} * cb->kinds * 2 * cb->levels;
  const auto bytes = r.Bytes(n);
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated codebook");
  cb->offsets.resize(n);
  std::memcpy(cb->offsets.data(), bytes.data(), n);
  return Status::Ok();
}

DequantFn PickDequant() {
#if defined(__x86_64__)
  if (simd::Avx2()) return &DequantAvx2;
#endif
  return &DequantScalar;
}

// Per-thread buffers reused across sections (grown, never shrunk or cleared:
// every element used is written first).
struct DecodeScratch {
  std::vector<rans::ParsedStream> streams;
  std::vector<uint32_t> symbols;
  std::vector<float> sigma, mean, st, st_recent, anchor, row, transformed, levels;
  std::vector<int32_t> level_offset;             // [kind][channel] (FusedSection)
  std::vector<const rans::DecodeTable*> cycles;  // a batch's streams' table cycles, D entries each
  std::vector<int32_t> dim_offsets;              // a batch's streams' value-table offsets, D each
  std::vector<rans::TableStream> table_streams;
  std::vector<internal::FusedStream> fused;
};

DecodeScratch& Scratch() {
  thread_local DecodeScratch s;
  return s;
}

// Streams decoded together (heads x anchor/delta) before or while their rows
// are reconstructed: what the AVX2 rANS decoder interleaves, while the
// symbols stay within the L2 cache.
constexpr uint32_t kBatchStreams = 8;

}  // namespace

const std::array<float, 256>& SigmaTable() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = SigmaFromCode(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

Status ParseSectionHeader(const SectionLayout& l, ByteReader& r, SectionHeader* hdr, float* sigma, float* mean) {
  const uint32_t C = l.channels();
  const uint8_t flags = r.U8();
  const float step = r.F32();
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated header");
  if (flags & ~kSectionFlagsKnown) return Status::Corrupt("cachegen section: unknown flags " + std::to_string(flags));
  if (!(step > 0) || !std::isfinite(step) || step > 1e30f) return Status::Corrupt("cachegen section: invalid step");
  const internal::ProfileData* prof = l.profile;
  if ((flags & (kSectionProfileStats | kSectionProfileTables)) && !prof)
    return Status::Corrupt("cachegen section: uses a profile but the frame references none");
  int grid = -1;
  if (flags & kSectionProfileTables) {
    grid = r.U8();
    if (!r.ok() || uint32_t(grid) >= prof->grid_points)
      return Status::Corrupt("cachegen section: profile grid point out of range");
  }
  hdr->flags = flags;
  hdr->step = step;
  hdr->grid = grid;
  hdr->stats_begin = r.position();
  const std::array<float, 256>& sigma_table = SigmaTable();
  if (flags & kSectionProfileStats) {
    const auto& sc_codes = prof->sigma_code[l.section];
    const auto& mc_codes = prof->mean_code[l.section];
    for (uint32_t c = 0; c < C; ++c) {
      sigma[c] = sigma_table[sc_codes[c]];
      mean[c] = MeanFromCode(mc_codes[c], sigma[c]);
    }
  } else {
    auto sigma_codes = r.Bytes(C);
    if (!r.ok()) return Status::Corrupt("cachegen section: truncated header");
    for (uint32_t c = 0; c < C; ++c) {
      sigma[c] = sigma_table[sigma_codes[c]];
      const uint64_t z = r.Varint();
      if (!r.ok() || z > (uint64_t{1} << 31)) return Status::Corrupt("cachegen section: invalid channel mean");
      mean[c] = MeanFromCode(UnZigZag(static_cast<uint32_t>(z)), sigma[c]);
    }
  }
  return Status::Ok();
}

namespace {

// The streams of one batch of heads (per head its anchor stream, then with
// deltas its delta stream), parsed. A stream of a section with profile
// tables is a cycle of tables (per dim its channel's: the head's table, or
// with channel classes its class's) and decodes with them from the profile's
// cache; other streams carry their table inline (FORMAT.md "Symbol streams").
struct BatchStreams {
  uint32_t count = 0;
  bool table_form[kBatchStreams] = {};
  rans::ParsedStream* inline_stream[kBatchStreams] = {};
  rans::TableStream* table_stream[kBatchStreams] = {};
  uint32_t head[kBatchStreams] = {}, kind[kBatchStreams] = {};
  uint32_t* out[kBatchStreams] = {};
};

// Where a section's streams find their tables: none (inline), or a profile's.
struct SectionTables {
  const internal::SectionDecodeTables* profile = nullptr;
  bool classes = false;  // mode-2 (inline) streams are corrupt in a class section
};

// Parses the next stream (head, kind) of a batch as its k-th; inline tables
// in form `form`.
Status ParseBatchStream(ByteReader& r, const SectionLayout& l, const SectionTables& tables, DecodeScratch& sc,
                        uint32_t k, uint32_t head, uint32_t kind, std::span<uint32_t> out, rans::TableForm form,
                        BatchStreams* b) {
  const uint32_t D = l.head_dim;
  b->head[k] = head;
  b->kind[k] = kind;
  b->out[k] = out.data();
  ByteReader peek = r;
  const bool inline_table = !tables.profile || (!tables.classes && peek.U8() == rans::kModeRans);
  b->table_form[k] = !inline_table;
  if (inline_table) {
    b->inline_stream[k] = &sc.streams[k];
    return rans::ParseStream(r, out.size(), b->inline_stream[k], form);
  }
  const std::span<const rans::DecodeTable*> cycle(sc.cycles.data() + size_t{k} * D, D);
  for (uint32_t d = 0; d < D; ++d) cycle[d] = tables.profile->Symbols(kind, head * D + d);
  b->table_stream[k] = &sc.table_streams[k];
  return rans::ParseStreamWithTables(r, cycle, out, b->table_stream[k]);
}

// Decodes a parsed batch's symbols into their outputs (the generic schedule).
Status DecodeBatchSymbols(const BatchStreams& b) {
  rans::ParsedStream* ps[kBatchStreams];
  uint32_t* po[kBatchStreams];
  rans::TableStream* ts[kBatchStreams];
  size_t np = 0, nt = 0;
  for (uint32_t k = 0; k < b.count; ++k) {
    if (b.table_form[k]) {
      ts[nt++] = b.table_stream[k];
    } else {
      ps[np] = b.inline_stream[k];
      po[np++] = b.out[k];
    }
  }
  if (np) CG_RETURN_IF_ERROR(rans::DecodeParsed(std::span(ps, np), std::span(po, np)));
  if (nt) CG_RETURN_IF_ERROR(rans::DecodeStreamsWithTables(std::span(ts, nt)));
  return Status::Ok();
}

// The fused schedule's view of a parsed batch; false when some stream is not
// an 8-lane rANS stream (empty and constant streams, one lane).
bool FusedStreams(const BatchStreams& b, const SectionLayout& l, const SectionTables& tables, DecodeScratch& sc) {
  const uint32_t D = l.head_dim, C = l.channels();
  for (uint32_t k = 0; k < b.count; ++k) {
    internal::FusedStream& f = sc.fused[k];
    if (!b.table_form[k]) {
      const rans::ParsedStream& p = *b.inline_stream[k];
      if (p.mode != rans::kModeRans || p.lanes != 8) return false;
      f = {p.table, nullptr, p.escape, nullptr, p.state, p.esc, p.payload};
      continue;
    }
    const rans::TableStream& t = *b.table_stream[k];
    if (t.mode != rans::kModeTable || t.lanes != 8) return false;
    const internal::SectionDecodeTables& pt = *tables.profile;
    const size_t c0 = size_t{b.kind[k]} * C + size_t{b.head[k]} * D;
    f = {pt.values.data(), nullptr, 0, nullptr, t.state, t.esc, t.payload};
    if (tables.classes) {
      int32_t* off = sc.dim_offsets.data() + size_t{k} * D;
      for (uint32_t d = 0; d < D; ++d) off[d] = static_cast<int32_t>(pt.channel_table[c0 + d] * rans::kProbScale);
      f.dim_offset = off;
      f.dim_escape = pt.channel_escape.data() + c0;
    } else {
      f.table = pt.Values(b.head[k], b.kind[k]);
      f.escape = pt.channel_escape[c0];
    }
  }
  return true;
}

}  // namespace

Status DecodeCacheGenSection(const SectionLayout& l, std::span<const uint8_t> payload, const SectionSink& sink) {
  const uint32_t H = l.kv_heads, D = l.head_dim, C = l.channels(), tq = l.quantized_tokens();
  ByteReader r(payload);
  DecodeScratch& sc = Scratch();
  float* sigma = GrowScratch(sc.sigma, C);
  float* mean = GrowScratch(sc.mean, C);
  SectionHeader hdr;
  CG_RETURN_IF_ERROR(ParseSectionHeader(l, r, &hdr, sigma, mean));
  const float step = hdr.step;
  const bool use_delta = hdr.flags & kSectionDelta;
  const internal::ProfileData* prof = l.profile;
  SectionTables tables;
  if (hdr.grid >= 0) {
    tables.profile = &prof->decode_tables.Get(*prof, l.section, static_cast<uint32_t>(hdr.grid));
    tables.classes = prof->HasClasses(l.section);
  }
  // Reconstruction levels per (channel group, stream kind), when the section has a codebook.
  Codebook cb;
  float* levels = nullptr;
  LevelTables lt;
  int32_t* level_offset = nullptr;
  if (hdr.flags & kSectionCodebook) {
    CG_RETURN_IF_ERROR(ReadCodebook(r, C, use_delta, &cb));
    const size_t per = 2 * size_t{cb.levels} + 1;
    levels = GrowScratch(sc.levels, size_t{cb.groups(C)} * cb.kinds * per);
    for (uint32_t g = 0; g < cb.groups(C); ++g)
      for (uint32_t k = 0; k < cb.kinds; ++k) cb.Levels(g, k, levels + (size_t{g} * cb.kinds + k) * per);
    lt = {levels, 2 * cb.levels, cb.kinds, cb.group_channels};
    level_offset = GrowScratch(sc.level_offset, size_t{2} * C);
    for (uint32_t k = 0; k < 2; ++k)
      for (uint32_t c = 0; c < C; ++c)
        level_offset[size_t{k} * C + c] =
            static_cast<int32_t>((size_t{c / cb.group_channels} * cb.kinds + std::min(k, cb.kinds - 1)) * per);
  }
  // Steps of the older and of the recent tokens (TokenStep), per channel.
  float* st = GrowScratch(sc.st, C);
  float* st_recent = GrowScratch(sc.st_recent, C);
  const float step_recent = TokenStep(l, step, l.recent_begin);
  for (uint32_t c = 0; c < C; ++c) {
    st[c] = sigma[c] * step;
    st_recent[c] = sigma[c] * step_recent;
  }

  const StreamCounts counts = CountStreams(l, use_delta);
  const size_t na = size_t{counts.anchors} * D, nd = size_t{counts.deltas} * D;
  const uint32_t per_head = use_delta ? 2 : 1;
  const uint32_t batch = std::min(H, kBatchStreams / per_head);
  GrowScratch(sc.streams, kBatchStreams);
  GrowScratch(sc.table_streams, kBatchStreams);
  GrowScratch(sc.fused, kBatchStreams);
  GrowScratch(sc.cycles, size_t{kBatchStreams} * D);
  GrowScratch(sc.dim_offsets, size_t{kBatchStreams} * D);
  uint32_t* symbols = GrowScratch(sc.symbols, size_t{batch} * (na + nd));
  float* anchor = GrowScratch(sc.anchor, D);
  float* row = GrowScratch(sc.row, D);
  float* transformed = l.transform ? GrowScratch(sc.transformed, D) : nullptr;
  const DequantFn dequant = PickDequant();
  const uint32_t G = use_delta ? l.group_tokens : 1;
#if defined(__x86_64__)
  const bool fused_f16 =
      !levels && !l.rotate && !l.transform && !sink.rope && sink.view.dtype() == DType::kF16 && sink.view.strides().dim == 1 && simd::Avx2();
#endif

  // The fused schedule takes the flags above; a section with any other (a
  // later addition to the format) stays with the generic one.
  const bool fused = (hdr.flags & ~kSectionFlagsKnown) == 0 && internal::FusedApplies(l, sink, use_delta);
  const internal::FusedSection fs{&l, &sink, use_delta, mean, st, st_recent, levels, level_offset, lt.top};

  for (uint32_t h0 = 0; h0 < H; h0 += batch) {
    const uint32_t hn = std::min(batch, H - h0);
    BatchStreams b;
    b.count = hn * per_head;
    // Parses the batch's streams (per head: anchors, then deltas).
    auto parse = [&](rans::TableForm form) -> Status {
      for (uint32_t h = 0, k = 0; h < hn; ++h) {
        uint32_t* base = symbols + size_t{h} * (na + nd);
        for (uint32_t kind = 0; kind < per_head; ++kind, ++k)
          CG_RETURN_IF_ERROR(ParseBatchStream(r, l, tables, sc, k, h0 + h, kind,
                                              {base + (kind ? na : 0), kind ? nd : na}, form, &b));
      }
      return Status::Ok();
    };
    const ByteReader batch_start = r;
    if (fused) {
      CG_RETURN_IF_ERROR(parse(rans::TableForm::kZigZagValues));
      if (FusedStreams(b, l, tables, sc) && internal::DecodeFusedBatch(fs, sc.fused.data(), h0, hn)) continue;
      // Not for the fused schedule after all (or corrupt): the generic one
      // decodes the same bytes again and has the last word.
      r = batch_start;
    }
    CG_RETURN_IF_ERROR(parse(rans::TableForm::kSymbols));
    CG_RETURN_IF_ERROR(DecodeBatchSymbols(b));
    // Reconstruct exactly as the encoder's Quantize() did, head by head.
    for (uint32_t h = 0; h < hn; ++h) {
      const uint32_t head = h0 + h;
      const size_t c0 = size_t{head} * D;
      const uint32_t* asym = symbols + size_t{h} * (na + nd);
      const uint32_t* dsym = asym + na;
#if defined(__x86_64__)
      if (fused_f16) {
        for (uint32_t g0 = 0; g0 < tq; g0 += G) {
          const uint32_t g1 = std::min(g0 + G, tq);
          for (uint32_t t = g0; t < g1; ++t) {
            const float* stt = (t >= l.recent_begin ? st_recent : st) + c0;
            uint8_t* dst = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t, head, 0));
            if (t == g0) {
              DequantF16Avx2(asym, mean + c0, stt, anchor, dst, D);
              asym += D;
            } else {
              DequantF16Avx2(dsym, anchor, stt, nullptr, dst, D);
              dsym += D;
            }
          }
        }
        continue;
      }
#endif
      for (uint32_t g0 = 0; g0 < tq; g0 += G) {
        const uint32_t g1 = std::min(g0 + G, tq);
        for (uint32_t t = g0; t < g1; ++t) {
          const float* stt = (t >= l.recent_begin ? st_recent : st) + c0;
          float* rec = t == g0 ? anchor : row;
          if (t == g0) {
            if (levels)
              DequantLevels(lt, 0, uint32_t(c0), asym, mean + c0, stt, anchor, D);
            else
              dequant(asym, mean + c0, stt, anchor, D);
            asym += D;
          } else {
            if (levels)
              DequantLevels(lt, 1, uint32_t(c0), dsym, anchor, stt, row, D);
            else
              dequant(dsym, anchor, stt, row, D);
            dsym += D;
          }
          if (l.rotate) {
            if (rec == anchor) {
              std::memcpy(row, anchor, size_t{D} * sizeof(float));
              rec = row;
            }
            HadamardInPlace(rec, D);
          } else if (l.transform) {
            HeadFromCoding(l.transform_t + size_t{head} * D * D, rec, transformed, D);
            rec = transformed;
          }
          sink.Store(t, head, rec);
        }
      }
    }
  }

  const size_t exact_values = size_t{l.tokens - tq} * C;
  if (r.remaining() != exact_values * 2)
    return Status::Corrupt("cachegen section: " + std::to_string(r.remaining()) + " trailing bytes, expected " +
                           std::to_string(exact_values * 2));
  for (uint32_t t = tq; t < l.tokens; ++t)
    for (uint32_t h = 0; h < H; ++h) {
      for (uint32_t d = 0; d < D; ++d) row[d] = F16ToF32(r.U16());
      sink.Store(t, h, row);
    }
  return Status::Ok();
}

void SectionSink::Store(uint32_t token, uint32_t head, const float* values) const {
  const uint32_t D = view.shape().head_dim;
  if (rope) {
    thread_local std::vector<float> roped;
    if (roped.size() < D) roped.resize(D);
    std::memcpy(roped.data(), values, size_t{D} * sizeof(float));
    rope->Apply(token, roped.data(), /*inverse=*/false);
    values = roped.data();
  }
  if (view.strides().dim == 1) {
    StoreRow(view.dtype(), values, D, view.Pointer(layer, kv, token, head, 0));
  } else {
    for (uint32_t d = 0; d < D; ++d) view.Set(layer, kv, token, head, d, values[d]);
  }
}

Status DecodeCacheGenSection(const SectionLayout& l, std::span<const uint8_t> payload, std::span<float> out,
                             const RopeTable* rope) {
  const uint64_t C = l.channels();
  if (out.size() != size_t{l.tokens} * C) return Status::Internal("cachegen section: output size mismatch");
  const KVShape shape{1, l.kv_heads, l.head_dim, l.tokens};
  const KVStrides strides{0, 0, static_cast<int64_t>(C), l.head_dim, 1};
  return DecodeCacheGenSection(l, payload, SectionSink{KVView(out.data(), DType::kF32, shape, strides), 0, KV::kKey, rope});
}

}  // namespace cachegen
