#include "codec/cachegen/rope.h"

#include <cmath>
#include <memory>
#include <string>

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

void RopeTable::Apply(uint32_t t, float* x, bool inverse) const {
  const float* cs = &cos_[size_t{t} * pairs_];
  const float* sn = &sin_[size_t{t} * pairs_];
  const bool neox = rope_.kind == RopeConfig::Kind::kNeox;
  for (uint32_t i = 0; i < pairs_; ++i) {
    const uint32_t a = neox ? i : 2 * i;
    const uint32_t b = neox ? i + pairs_ : 2 * i + 1;
    const float x0 = x[a], x1 = x[b], c = cs[i], s = inverse ? -sn[i] : sn[i];
    // Products rounded before the sum (no fused multiply-add), as FORMAT.md writes it.
    const float p00 = x0 * c, p11 = x1 * s, p01 = x0 * s, p10 = x1 * c;
    x[a] = p00 - p11;
    x[b] = p01 + p10;
  }
}

const RopeTable& CachedRopeTable(const RopeConfig& rope, uint32_t token_start, uint32_t tokens) {
  thread_local std::unique_ptr<RopeTable> cached;
  if (!cached || cached->token_start() != token_start || cached->tokens() != tokens ||
      cached->rope().kind != rope.kind || cached->rope().dims != rope.dims ||
      cached->rope().freq_base != rope.freq_base || cached->rope().freq_scale != rope.freq_scale)
    cached = std::make_unique<RopeTable>(rope, token_start, tokens);
  return *cached;
}

}  // namespace cachegen
