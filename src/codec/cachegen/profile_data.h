// What a parsed .cgprof holds (include/cachegen/profile.h; docs/FORMAT.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/status.h"
#include "codec/cachegen/profile_decode_tables.h"
#include "codec/rans.h"

namespace cachegen::internal {

struct ProfileData {
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  bool rotate = false;
  RopeConfig rope;  // kind kNone: keys learned as cached
  uint32_t group_tokens = 1;
  // The quantizer the K tables were learned for (recorded from version 3 on:
  // flag bit 2 = the learned quantizer); versions 1 and 2 do not say.
  enum class TablesFor : uint8_t { kUnknown, kUniform, kLloyd } tables_for = TablesFor::kUnknown;
  int32_t grid_first = 0;  // step grid: log2(step) = (grid_first + g) / kGridPerOctave
  uint32_t grid_points = 0;
  uint32_t contexts = 0, tokens = 0;  // what it was trained on (informative)
  // Per section (layer l: 2l = K, 2l + 1 = V), per channel.
  std::vector<std::vector<uint8_t>> sigma_code;
  std::vector<std::vector<int32_t>> mean_code;
  // Per section, the units its tables are per: KV heads, or (format version
  // 4) channel classes: classes[section] > 0 classes, class_of[section][kind
  // * C + c] the class of channel c in streams of kind 0 (anchors) and 1
  // (deltas); a stream's symbols are then coded with their channels' tables
  // (rans::EncodeStreamWithTables).
  std::vector<uint8_t> classes;  // empty: no section has classes
  std::vector<std::vector<uint8_t>> class_of;
  // [section][grid point][unit][0 anchor | 1 delta]; section s from table_begin[s] (IndexTables).
  std::vector<rans::FreqTable> tables;
  std::vector<size_t> table_begin;
  // Per section: the model's measured sensitivity, mean KL of its next-token
  // distributions per unit of squared section step (format version 2); empty
  // when not measured. Rate control then sets step_i ∝ 1/sqrt(w_i).
  std::vector<float> sensitivity;
  // Optionally (format version 5) the measured mean KL of each section alone
  // at rising steps: curve_kl[section * curve_steps.size() + p] at
  // curve_steps[p]. PredictedKl reads it.
  std::vector<float> curve_steps, curve_kl;
  float q8_kl = 0;  // SensitivityCurve::q8_kl (with a curve only); 0 = not measured
  std::vector<float> joint_predicted, joint_measured;  // SensitivityCurve's joint calibration
  // Per section: empty, or per KV head an orthonormal D x D matrix U
  // (head_transform.h; format version 3): the section is coded as U^T x.
  // transform_t holds the transposes (for decoders), made on parse.
  std::vector<std::vector<float>> transform, transform_t;
  // The tables above in the decoders' form, built on first use.
  ProfileDecodeTables decode_tables;

  static constexpr int32_t kGridPerOctave = 4;
  uint32_t channels() const { return kv_heads * head_dim; }
  bool HasTransform(uint32_t section) const { return section < transform.size() && !transform[section].empty(); }
  bool HasClasses(uint32_t section) const { return section < classes.size() && classes[section] > 0; }
  uint32_t TableUnits(uint32_t section) const { return HasClasses(section) ? classes[section] : kv_heads; }
  // Sets table_begin from the sections' units; returns the table count.
  size_t IndexTables() {
    table_begin.resize(size_t{layers} * 2);
    size_t n = 0;
    for (uint32_t s = 0; s < layers * 2; ++s) {
      table_begin[s] = n;
      n += size_t{grid_points} * TableUnits(s) * 2;
    }
    return n;
  }
  const rans::FreqTable& Table(uint32_t section, uint32_t g, uint32_t unit, uint32_t kind) const {
    return tables[table_begin[section] + (size_t{g} * TableUnits(section) + unit) * 2 + kind];
  }
  // The table channel c's symbols of stream kind `kind` are coded with.
  const rans::FreqTable& ChannelTable(uint32_t section, uint32_t g, uint32_t kind, uint32_t c) const {
    return Table(section, g, HasClasses(section) ? class_of[section][size_t{kind} * channels() + c] : c / head_dim, kind);
  }
  // Per-section step multipliers from the sensitivities (StepFactors below);
  // empty without sensitivities.
  std::vector<float> SensitivityStepFactors() const { return StepFactors(sensitivity); }
  // sqrt(gmean(w) / w_i) for each sensitivity w_i (their geometric mean is 1).
  static std::vector<float> StepFactors(std::span<const float> w) {
    if (w.empty()) return {};
    double log_mean = 0;
    for (float v : w) log_mean += std::log(double(v));
    log_mean /= double(w.size());
    std::vector<float> f(w.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(std::exp(0.5 * (log_mean - std::log(double(w[i])))));
    return f;
  }
  // The KL predicted for a frame whose sections' SectionKl sum to `sum`:
  // scaled by the joint calibration's measured / predicted ratio at `sum`
  // (log-log between its points, the end ratios beyond them); `sum` as it is
  // without a calibration.
  double CalibratedKl(double sum) const {
    const size_t n = joint_predicted.size();
    if (n == 0 || !(sum > 0)) return sum;
    auto log_ratio = [&](size_t j) {
      return std::log(std::max(double(joint_measured[j]), 1e-30) / std::max(double(joint_predicted[j]), 1e-30));
    };
    if (sum <= joint_predicted[0]) return sum * std::exp(log_ratio(0));
    for (size_t j = 1; j < n; ++j)
      if (sum <= joint_predicted[j]) {
        const double t = std::log(sum / joint_predicted[j - 1]) / std::log(double(joint_predicted[j]) / joint_predicted[j - 1]);
        return sum * std::exp(log_ratio(j - 1) + t * (log_ratio(j) - log_ratio(j - 1)));
      }
    return sum * std::exp(log_ratio(n - 1));
  }
  // The mean next-token KL predicted with section `section` alone coded at
  // `step`: log-log interpolation of the measured curve, KL ∝ step^2 below
  // its first step and the last value above its last (the section then
  // carries nothing more to lose); without a curve sensitivity * step^2; -1
  // without sensitivities. Non-decreasing in step.
  double SectionKl(uint32_t section, double step) const {
    if (section >= sensitivity.size()) return -1;
    const size_t n = curve_steps.size();
    if (n == 0) return double(sensitivity[section]) * step * step;
    const float* kl = &curve_kl[size_t{section} * n];
    double prev = std::max(double(kl[0]), 1e-30);  // running maximum: measured noise never lowers the curve
    if (step <= curve_steps[0]) return prev * (step / curve_steps[0]) * (step / curve_steps[0]);
    for (size_t p = 1; p < n; ++p) {
      const double next = std::max(prev, double(kl[p]));
      if (step <= curve_steps[p]) {
        const double t = std::log(step / curve_steps[p - 1]) / std::log(double(curve_steps[p]) / curve_steps[p - 1]);
        return std::exp(std::log(prev) + t * (std::log(next) - std::log(prev)));
      }
      prev = next;
    }
    return prev;
  }
  // The grid point nearest to `step`, or -1 when it lies outside the grid.
  int GridIndex(float step) const {
    const double q = std::nearbyint(std::log2(double(step)) * kGridPerOctave) - grid_first;
    return q >= 0 && q < grid_points ? static_cast<int>(q) : -1;
  }
};

// Sensitivities are finite and within these bounds (KL per squared step).
constexpr float kMinSensitivity = 1e-30f, kMaxSensitivity = 1e30f;
// Whether a sensitivity curve (steps, and KL per section x step) and a joint
// calibration are valid (profile_format.cc: what parsing accepts).
bool ValidCurve(std::span<const float> steps, std::span<const float> kl, uint32_t sections);
bool ValidJoint(std::span<const float> predicted, std::span<const float> measured);

// The .cgprof bytes of a profile (profile_format.cc), and a profile from
// untrusted bytes (every field validated, the checksum checked).
std::vector<uint8_t> SerializeProfile(const ProfileData& d);
Result<ProfileData> ParseProfile(std::span<const uint8_t> bytes);

}  // namespace cachegen::internal
