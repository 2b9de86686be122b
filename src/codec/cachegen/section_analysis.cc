// SectionAnalysis's construction (section_coder.h): a section's rows in the
// coding domain (un-rotated keys as given; Hadamard-rotated or through the
// profile's head transform) and the per-channel statistics every
// quantization of the section uses -- the profile's, or the section's own
// when it has no profile or lies too far from it.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/section_coder.h"
#include "codec/cachegen/section_format.h"
#include "codec/cachegen/section_kernels.h"
#include "common/bytes.h"

namespace cachegen {
namespace {

// Side information of a section coded with its own statistics: header,
// scale codes and varint mean codes.
size_t SideInfoBytes(const std::vector<int32_t>& mean_code, size_t channels) {
  std::vector<uint8_t> tmp;
  ByteWriter w(&tmp);
  for (int32_t m : mean_code) w.Varint(ZigZag(m));
  return 1 + 4 + channels + tmp.size();
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
    for (uint32_t h = 0; h < layout.kv_heads; ++h)
      HeadRowsToCoding(layout.transform + size_t{h} * D * D, &rows_[size_t{h} * D], &y_[size_t{h} * D], D, tq, C);
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

}  // namespace cachegen
