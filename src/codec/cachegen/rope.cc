#include "codec/cachegen/rope.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen {

Status ValidateRope(const RopeConfig& r, uint32_t head_dim) {
  if (r.kind == RopeConfig::Kind::kNone) return Status::Ok();
  if (r.kind != RopeConfig::Kind::kNormal && r.kind != RopeConfig::Kind::kNeox)
    return Status::InvalidArgument("rope: unknown kind");
  if (r.dims == 0 || r.dims % 2 != 0 || r.dims > head_dim)
    return Status::InvalidArgument("rope: " + std::to_string(r.dims) + " rotated dims do not fit head dim " +
                                   std::to_string(head_dim) + " (must be even, 2..head_dim)");
  if (!(r.freq_base > 0) || !std::isfinite(r.freq_base) || !(r.freq_scale > 0) || !std::isfinite(r.freq_scale))
    return Status::InvalidArgument("rope: frequency base and scale must be finite and > 0");
  return Status::Ok();
}

RopeTable::RopeTable(const RopeConfig& rope, uint32_t token_start, uint32_t tokens)
    : rope_(rope), token_start_(token_start), tokens_(tokens), pairs_(rope.dims / 2) {
  cos_.resize(size_t{tokens} * pairs_);
  sin_.resize(size_t{tokens} * pairs_);
  std::vector<double> inv_freq(pairs_);
  for (uint32_t i = 0; i < pairs_; ++i)
    inv_freq[i] = double(rope.freq_scale) * std::pow(double(rope.freq_base), -2.0 * i / rope.dims);
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t i = 0; i < pairs_; ++i) {
      const double th = (double(token_start) + t) * inv_freq[i];
      cos_[size_t{t} * pairs_ + i] = static_cast<float>(std::cos(th));
      sin_[size_t{t} * pairs_ + i] = static_cast<float>(std::sin(th));
    }
}

namespace {

void ApplyScalar(const float* cs, const float* sn, uint32_t pairs, bool neox, float* x, bool inverse) {
  for (uint32_t i = 0; i < pairs; ++i) {
    const uint32_t a = neox ? i : 2 * i;
    const uint32_t b = neox ? i + pairs : 2 * i + 1;
    const float x0 = x[a], x1 = x[b], c = cs[i], s = inverse ? -sn[i] : sn[i];
    // Products rounded before the sum (no fused multiply-add), as FORMAT.md writes it.
    const float p00 = x0 * c, p11 = x1 * s, p01 = x0 * s, p10 = x1 * c;
    x[a] = p00 - p11;
    x[b] = p01 + p10;
  }
}

#if defined(__x86_64__)
// The same arithmetic 8 values at a time (products rounded, then the
// difference or sum; "avx2" has no FMA to contract into): normal pairs
// (2i, 2i + 1) 4 per register, NeoX pairs (i, i + pairs) 8 per register.
// Takes pairs % 4 == 0 (normal) or pairs % 8 == 0 (NeoX).
__attribute__((target("avx2"))) void ApplyAvx2(const float* cs, const float* sn, uint32_t pairs, bool neox, float* x,
                                              bool inverse) {
  const __m256 flip = _mm256_set1_ps(inverse ? -1.0f : 1.0f);  // exact: negates s
  if (neox) {
    for (uint32_t i = 0; i < pairs; i += 8) {
      const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_mul_ps(_mm256_loadu_ps(sn + i), flip);
      const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + pairs + i);
      _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
      _mm256_storeu_ps(x + pairs + i, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
    }
    return;
  }
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  for (uint32_t i = 0; i < pairs; i += 4) {
    const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
    const __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup), flip);
    const __m256 v = _mm256_loadu_ps(x + 2 * i);
    // Even lanes x0 c - x1 s, odd lanes x1 c + x0 s (= x0 s + x1 c).
    _mm256_storeu_ps(x + 2 * i, _mm256_addsub_ps(_mm256_mul_ps(v, c), _mm256_mul_ps(_mm256_permute_ps(v, 0xb1), s)));
  }
}
#endif

}  // namespace

void RopeTable::Apply(uint32_t t, float* x, bool inverse) const {
  const float* cs = &cos_[size_t{t} * pairs_];
  const float* sn = &sin_[size_t{t} * pairs_];
  const bool neox = rope_.kind == RopeConfig::Kind::kNeox;
#if defined(__x86_64__)
  if (simd::Avx2() && pairs_ % (neox ? 8 : 4) == 0) return ApplyAvx2(cs, sn, pairs_, neox, x, inverse);
#endif
  ApplyScalar(cs, sn, pairs_, neox, x, inverse);
}

RopeTable::RopeTable(const RopeTable& whole, uint32_t token_start, uint32_t tokens)
    : rope_(whole.rope_), token_start_(token_start), tokens_(tokens), pairs_(whole.pairs_) {
  const size_t begin = size_t{token_start - whole.token_start_} * pairs_, n = size_t{tokens} * pairs_;
  cos_.assign(whole.cos_.begin() + begin, whole.cos_.begin() + begin + n);
  sin_.assign(whole.sin_.begin() + begin, whole.sin_.begin() + begin + n);
}

namespace {

bool SameRope(const RopeConfig& a, const RopeConfig& b) {
  return a.kind == b.kind && a.dims == b.dims && a.freq_base == b.freq_base && a.freq_scale == b.freq_scale;
}

}  // namespace

const RopeTable& CachedRopeTable(const RopeConfig& rope, uint32_t token_start, uint32_t tokens) {
  thread_local std::unique_ptr<RopeTable> cached, whole;
  if (cached && cached->token_start() == token_start && cached->tokens() == tokens && SameRope(cached->rope(), rope))
    return *cached;
  const uint64_t end = uint64_t{token_start} + tokens;
  if (end > kRopeCachePositions) {
    cached = std::make_unique<RopeTable>(rope, token_start, tokens);
    return *cached;
  }
  if (!whole || whole->tokens() < end || !SameRope(whole->rope(), rope)) {
    // Grown in powers of two (at least 1024 positions) up to the cap.
    uint32_t n = whole && SameRope(whole->rope(), rope) ? whole->tokens() : 1024;
    while (n < end) n *= 2;
    whole = std::make_unique<RopeTable>(rope, 0, std::min(n, kRopeCachePositions));
  }
  cached = std::make_unique<RopeTable>(*whole, token_start, tokens);
  return *cached;
}

}  // namespace cachegen
