// Rate control of the cachegen codec (rate_control.h).
#include "codec/cachegen/rate_control.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "common/parallel.h"

namespace cachegen {
namespace {

// Each quality level below the first targets this fraction of the previous
// level's bits (bits mode), 6 dB less (SNR mode) or twice the error (max-error
// mode).
constexpr double kLevelBitsRatio = 0.75;
constexpr double kLevelSnrStepDb = 6.0;
// Frame bytes outside sections, for rate targets: fixed header plus one
// section-table entry per section (docs/FORMAT.md, "Frames and containers").
constexpr double kFrameFixedBytes = 64;
constexpr double kFrameBytesPerSection = 24;
// Rate control stops when the sampled estimate is within this fraction of
// its target, and when the full data's exact size is within this one.
constexpr double kSampledTolerance = 0.002;
constexpr double kFullTolerance = 0.003;
// Full-data corrections that move every section: with fewer than
// kMinSectionsToCorrectSome sections, up to kFullCorrections toward
// kFullTolerance, and more (up to kMaxFullCorrections) while beyond
// kFullLimit (near a profile grid boundary the size can jump by several
// percent); with more sections, up to kMaxFullCorrections while beyond
// kWholeCorrectionAbove, then up to kPartialCorrections that move one
// section in kCorrectedShare toward kFullTolerance (CorrectSome; in a chunk
// of few sections the moved ones' steps would move far).
constexpr int kFullCorrections = 2, kMaxFullCorrections = 4, kPartialCorrections = 3;
constexpr double kWholeCorrectionAbove = 0.02, kFullLimit = 0.008;
constexpr uint32_t kCorrectedShare = 4, kMinSectionsToCorrectSome = 8;
// The slope (bits/value per doubling of the step) the first full-data
// correction takes is the sampled search's, within these.
constexpr double kFullSlopeMin = -1.2, kFullSlopeMax = -0.6;

// Layer-wise allocation by rule from the layer count: the step multiplier
// grows geometrically from 2^(-slope/2) at layer 0 to 2^(slope/2) at the last.
float LayerFactor(uint32_t layer, uint32_t layers, double slope) {
  if (layers <= 1 || slope == 0) return 1.0f;
  return static_cast<float>(std::exp2(slope * (double(layer) / (layers - 1) - 0.5)));
}

// The delta choices of every level (made once per chunk at the sections'
// unit steps, on one token group in `sample_every`), kept in the memo.
Status MemoDeltas(const SectionAnalyses& a, const std::vector<float>& factors, uint32_t sample_every, uint32_t threads,
                  RateMemo* memo) {
  if (!memo->deltas.empty()) return Status::Ok();
  memo->deltas.resize(a.size());
  return ParallelFor(a.size(), threads, [&](uint64_t i) {
    memo->deltas[i] = a[i]->PreferDelta(factors[i], sample_every);
    return Status::Ok();
  });
}

// Section step multipliers of a KL target: the profile's sensitivity
// factors (equal predicted KL in every section: the least bits for a KL
// sum at high rate).
Result<std::vector<float>> KlStepFactors(const CodecConfig& cfg, uint32_t sections) {
  std::vector<float> f = cfg.profile ? cfg.profile->data().SensitivityStepFactors() : std::vector<float>{};
  if (f.size() != sections)
    return Status::InvalidArgument("a KL target needs a model profile with measured sensitivities");
  return f;
}

// The multiplier m of the section step factors at which the predicted KL
// sum reaches `target_kl` (bisection in log2 m: the prediction is
// non-decreasing in every step); the largest searched when even that
// predicts less.
double MultiplierForKl(const internal::ProfileData& d, const std::vector<float>& factors, double target_kl) {
  auto kl_at = [&](double log_m) {
    double kl = 0;
    for (size_t i = 0; i < factors.size(); ++i) kl += d.SectionKl(uint32_t(i), std::exp2(log_m) * factors[i]);
    return d.CalibratedKl(kl);
  };
  double lo = -20, hi = 20;
  if (kl_at(hi) <= target_kl) return std::exp2(hi);
  for (int iter = 0; iter < 60; ++iter) {
    const double mid = (lo + hi) / 2;
    (kl_at(mid) < target_kl ? lo : hi) = mid;
  }
  return std::exp2(lo);
}

// Per-section step whose measured reconstruction SNR is close to `snr_db`
// (a few corrections of the high-rate estimate step^2/12).
float StepForSnr(const SectionAnalysis& a, double snr_db, uint8_t* delta) {
  const double target_mse = a.signal_power() * std::pow(10.0, -snr_db / 10);
  double step = std::sqrt(12 * target_mse / std::max(1e-30, a.mean_sigma_sq()));
  step = std::clamp(step, 1e-6, 1e6);
  *delta = a.PreferDelta(static_cast<float>(step));
  for (int iter = 0; iter < 3; ++iter) {
    const double mse = a.MeasureMse(static_cast<float>(step), *delta);
    if (!(mse > 0) || std::abs(mse / target_mse - 1) < 0.05) break;
    step = std::clamp(step * std::sqrt(target_mse / mse), 1e-6, 1e6);
  }
  return static_cast<float>(step);
}

// The last corrections of bits-mode rate control move the steps of the
// quarter of the sections with the most bytes only (a quarter of the work
// of moving every section): from the step multiplier xq at which q was
// quantized, missing the target by `best` bits/value, the sections of S
// take xq + y (secant on y, starting from the whole data's slope scaled to
// S's share). For a miss of 2 % their steps move by about 10 %; the
// distortion at equal bits is about 0.2 % above moving every section's.
template <typename StepAt>
Status CorrectSome(const SectionAnalyses& a, const CodecConfig& cfg, const StepAt& step_at, double target_bits,
                   double xq, double best, double slope, double frame_bits, double values,
                   std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
  const uint32_t n = static_cast<uint32_t>(a.size());
  if (n < kMinSectionsToCorrectSome || !(std::abs(best) > kFullTolerance * target_bits)) return Status::Ok();
  std::vector<uint32_t> moved(n);
  std::iota(moved.begin(), moved.end(), 0u);
  const uint32_t k = std::max(1u, n / kCorrectedShare);
  std::partial_sort(moved.begin(), moved.begin() + k, moved.end(),
                    [&](uint32_t l, uint32_t r) { return (*q)[l].bytes > (*q)[r].bytes; });
  moved.resize(k);
  std::vector<bool> is_moved(n, false);
  for (uint32_t i : moved) is_moved[i] = true;
  double ya = 0, fa = best, slope_moved = slope * k / n;
  for (int iter = 0; iter < kPartialCorrections && std::abs(best) > kFullTolerance * target_bits; ++iter) {
    const double yb = std::clamp(ya - fa / slope_moved, ya - 1, ya + 1);
    CG_RETURN_IF_ERROR(ParallelFor(k, cfg.threads, [&](uint64_t j) {
      const uint32_t i = moved[j];
      a[i]->QuantizeStreams(step_at(xq + yb, i), (*q)[i].use_delta, 1, &(*spare)[i], &(*q)[i]);
      return Status::Ok();
    }));
    double bits = frame_bits;
    for (uint32_t i = 0; i < n; ++i) bits += (is_moved[i] ? (*spare)[i] : (*q)[i]).bytes * 8 / values;
    const double fb = bits - target_bits;
    if (std::abs(fb) < std::abs(best)) {
      best = fb;
      for (uint32_t i : moved) std::swap((*q)[i], (*spare)[i]);
    }
    if (std::abs(fb - fa) > 1e-9 && (fb - fa) / (yb - ya) < -0.05 * k / n) slope_moved = (fb - fa) / (yb - ya);
    ya = yb, fa = fb;
  }
  return Status::Ok();
}

// One global step multiplier (times the layer factor): a secant search on
// log2(step) against sampled size estimates of all sections, then the
// full data quantized at the point found; when its exact size misses the
// target, at most two corrections on the full data (the best point is kept).
Status StepsForBits(const SectionAnalyses& a, const KVShape& s, const CodecConfig& cfg, double target_bits,
                    RateMemo* memo, std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
  const uint32_t n = static_cast<uint32_t>(a.size());
  const double values = double(s.values());
  const double frame_bytes = kFrameFixedBytes + kFrameBytesPerSection * n;
  // Sample about 8 token groups per section during the search: with
  // thousands of channels per section that is tens of thousands of symbols,
  // plenty for the histograms, and it keeps the search cheap.
  constexpr uint32_t kSampledGroups = 8;
  const uint32_t groups = std::max(1u, s.tokens / std::max(1u, a[0]->layout().group_tokens));
  const uint32_t sample_every = std::max(1u, groups / kSampledGroups);
  // Section i is layer i / 2, K when i is even. A profile with measured
  // sensitivities w_i replaces the rule (layer slope, key scale) by
  // step_i ∝ 1/sqrt(w_i): equal weighted distortion w_i step_i^2 in every
  // section, which minimises their sum at a bit budget at high rate.
  const float key_scale = static_cast<float>(cfg.key_step_scale);
  const std::vector<float> measured = cfg.profile ? cfg.profile->data().SensitivityStepFactors() : std::vector<float>{};
  auto factor = [&](uint32_t i) {
    if (!measured.empty()) return measured[i];
    return LayerFactor(i / 2, s.layers, cfg.layer_slope) * (i % 2 == 0 ? key_scale : 1.0f);
  };
  auto step_at = [&](double log_step, uint32_t i) { return static_cast<float>(std::exp2(log_step)) * factor(i); };
  std::vector<float> factors(n);
  for (uint32_t i = 0; i < n; ++i) factors[i] = factor(i);
  CG_RETURN_IF_ERROR(MemoDeltas(a, factors, sample_every, cfg.threads, memo));
  const std::vector<uint8_t>& deltas = memo->deltas;
  // Bits per value of the sections quantized into qs at log_step (with
  // the codebooks of `near`'s quantizations where they are near enough,
  // SectionAnalysis::QuantizeStreams).
  auto bits_at = [&](double log_step, uint32_t every, std::vector<QuantizedSection>* qs,
                     const std::vector<QuantizedSection>* near = nullptr) -> Result<double> {
    CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
      a[i]->QuantizeStreams(step_at(log_step, uint32_t(i)), deltas[i], every, &(*qs)[i], near ? &(*near)[i] : nullptr);
      return Status::Ok();
    }));
    double total = frame_bytes;
    for (const QuantizedSection& x : *qs) total += x.bytes;
    return total * 8 / values;
  };

  // Sampled search, aimed at the target times the sampled estimate's bias
  // seen so far; it starts from the two nearest points evaluated for an
  // earlier level, else from the unit step and a slope of -1.
  const double sampled_target = target_bits * memo->bias;
  auto sampled_at = [&](double x) -> Result<double> {
    CG_ASSIGN_OR_RETURN(const double b, bits_at(x, sample_every, spare, spare));
    memo->sampled.emplace_back(x, b);
    return b - sampled_target;
  };
  double x0 = 0, x1 = 0, f0 = 0;
  if (memo->sampled.size() >= 2) {
    std::vector<std::pair<double, double>> near = memo->sampled;
    std::sort(near.begin(), near.end(), [&](const auto& l, const auto& r) {
      return std::abs(l.second - sampled_target) < std::abs(r.second - sampled_target);
    });
    x0 = near[1].first;
    f0 = near[1].second - sampled_target;
    x1 = near[0].first;
    if (std::abs(near[0].second - near[1].second) > 1e-9 && x0 != x1) {
      const double slope = (near[0].second - near[1].second) / (x1 - x0);
      if (slope < -0.05) x1 -= (near[0].second - sampled_target) / slope;
    }
  } else {
    CG_ASSIGN_OR_RETURN(f0, sampled_at(x0));
    x1 = x0 + f0;  // bits fall by about one per doubling of the step
  }
  x1 = std::clamp(x1, -20.0, 20.0);
  double slope = -1;  // d bits / d log2 step, last secant
  for (int iter = 0; iter < 10; ++iter) {
    CG_ASSIGN_OR_RETURN(const double f1, sampled_at(x1));
    double next = x1 + f1;  // fallback slope -1
    if (std::abs(f1 - f0) > 1e-9 && x1 != x0) {
      const double sl = (f1 - f0) / (x1 - x0);
      if (sl < -0.05) {
        slope = sl;
        next = x1 - f1 / sl;
      }
    }
    x0 = x1;
    f0 = f1;
    if (std::abs(f0) <= kSampledTolerance * target_bits) break;
    x1 = std::clamp(std::clamp(next, x0 - 4, x0 + 4), -20.0, 20.0);
  }
  const double sampled_bits = f0 + sampled_target;

  // The full data at x0, then corrections along the sampled slope and by
  // secant, which reuse the codebooks learned at x0; q keeps the best point.
  // The last sampled secant may span a tiny step (the search ends close to
  // its target) and be far off the full data's slope; the full data's
  // slopes measured on docs6L and the Llama-3.2-1B shape lie in -0.6 ... -1.2
  // bits per doubling at 0.8-2 bits/value.
  slope = std::clamp(slope, kFullSlopeMin, kFullSlopeMax);
  CG_ASSIGN_OR_RETURN(const double full0, bits_at(x0, 1, q));
  memo->bias = sampled_bits / full0;
  double xq = x0, xa = x0, fa = full0 - target_bits, best = fa;
  auto off = [&](double f, double limit) { return std::abs(f) > limit * target_bits; };
  // Every section moves while the size is far off (or until it is within
  // tolerance, when there are too few sections to move some of them only).
  const double whole_above = n >= kMinSectionsToCorrectSome ? kWholeCorrectionAbove : kFullTolerance;
  for (int iter = 0; iter < kMaxFullCorrections && off(best, kFullTolerance) &&
                     off(best, iter < kFullCorrections ? whole_above : std::max(whole_above, kFullLimit));
       ++iter) {
    const double xb = std::clamp(xa - fa / slope, std::max(-20.0, xa - 4), std::min(20.0, xa + 4));
    CG_ASSIGN_OR_RETURN(double fb, bits_at(xb, 1, spare, q));
    fb -= target_bits;
    if (std::abs(fb) < std::abs(best)) {
      best = fb;
      xq = xb;
      q->swap(*spare);
    }
    if (std::abs(fb - fa) > 1e-9 && (fb - fa) / (xb - xa) < -0.05) slope = (fb - fa) / (xb - xa);
    xa = xb, fa = fb;
  }
  return CorrectSome(a, cfg, step_at, target_bits, xq, best, slope, frame_bytes * 8 / values, values, q, spare);
}

}  // namespace

// Fills q with the level's full-data quantization of every section; spare
// is scratch of the same size.
Status ChooseSteps(const SectionAnalyses& a, const KVShape& s, const CodecConfig& cfg, uint32_t level, RateMemo* memo,
                   std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
  const uint32_t n = static_cast<uint32_t>(a.size());
  std::vector<float> steps(n);
  std::vector<uint8_t> deltas(n);
  if (cfg.max_rel_error > 0) {
    // Uniform quantization error is at most half a step.
    const float step = static_cast<float>(2 * cfg.max_rel_error * std::exp2(double(level)));
    for (uint32_t i = 0; i < n; ++i) steps[i] = step;
    CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
      deltas[i] = a[i]->PreferDelta(steps[i]);
      return Status::Ok();
    }));
  } else if (cfg.max_kl > 0) {
    const double target = cfg.max_kl * std::pow(kLevelKlRatio, level);
    CG_ASSIGN_OR_RETURN(const std::vector<float> factors, KlStepFactors(cfg, n));
    const double m = MultiplierForKl(cfg.profile->data(), factors, target);
    for (uint32_t i = 0; i < n; ++i) steps[i] = static_cast<float>(std::clamp(m * factors[i], 1e-6, 1e6));
    CG_RETURN_IF_ERROR(MemoDeltas(a, factors, 1, cfg.threads, memo));
    deltas = memo->deltas;
  } else if (cfg.snr_db > 0) {
    const double snr = cfg.snr_db - kLevelSnrStepDb * level;
    CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
      steps[i] = StepForSnr(*a[i], snr, &deltas[i]);
      return Status::Ok();
    }));
  } else {
    const double target =
        cfg.level_bits.empty()
            ? (cfg.bits_per_value > 0 ? cfg.bits_per_value : kDefaultBitsPerValue) * std::pow(kLevelBitsRatio, level)
            : cfg.level_bits[level];
    return StepsForBits(a, s, cfg, target, memo, q, spare);
  }
  return ParallelFor(n, cfg.threads, [&](uint64_t i) {
    a[i]->QuantizeStreams(steps[i], deltas[i], 1, &(*q)[i]);
    return Status::Ok();
  });
}

// Sum over sections of each one's predicted KL at its step (the sections'
// effects add up at small errors), scaled by the profile's joint
// calibration; -1 without sensitivities.
double PredictedKl(const internal::ProfileData& d, const std::vector<QuantizedSection>& q) {
  if (d.sensitivity.size() != q.size()) return -1;
  double kl = 0;
  for (size_t i = 0; i < q.size(); ++i) kl += d.SectionKl(uint32_t(i), q[i].step);
  return d.CalibratedKl(kl);
}

}  // namespace cachegen
