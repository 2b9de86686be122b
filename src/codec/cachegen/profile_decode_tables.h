// A model profile's entropy tables in the decoders' form, built once per
// (section, grid point) on first use and kept with the profile, so a frame's
// table-form streams (FORMAT.md "Symbol streams", mode 3) decode without
// building a 4096-entry table per stream: a section with channel classes has
// up to 32 tables, each as large as the section's symbols at low rates.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "codec/rans.h"

namespace cachegen::internal {

struct ProfileData;

// The tables of one section at one grid point, per [unit][kind] (units: KV
// heads, or the section's channel classes), and per [kind][channel] which of
// them a channel's symbols take.
struct SectionDecodeTables {
  uint32_t units = 0;
  uint32_t channels = 0;
  // Form TableForm::kSymbols (the generic decoder's table cycles).
  std::vector<rans::DecodeTable> symbols;
  // Form TableForm::kZigZagValues, kProbScale entries per table (the fused decoder).
  std::vector<uint32_t> values;
  // Per [kind][channel]: the index of its table (unit * 2 + kind) and that
  // table's escape symbol.
  std::vector<uint32_t> channel_table, channel_escape;

  const rans::DecodeTable* Symbols(uint32_t kind, uint32_t channel) const {
    return &symbols[channel_table[size_t{kind} * channels + channel]];
  }
  const uint32_t* Values(uint32_t unit, uint32_t kind) const {
    return values.data() + (size_t{unit} * 2 + kind) * rans::kProbScale;
  }
};

// The cache a ProfileData holds: thread-safe, filled lazily, never shrunk.
// Copies start empty (the tables are derived from the profile's bytes).
class ProfileDecodeTables {
 public:
  ProfileDecodeTables() = default;
  ProfileDecodeTables(const ProfileDecodeTables&) {}
  ProfileDecodeTables& operator=(const ProfileDecodeTables&) { return *this; }

  // The tables of (section, grid point) of `profile` (which holds this
  // cache); grid < profile.grid_points, section < 2 * layers.
  const SectionDecodeTables& Get(const ProfileData& profile, uint32_t section, uint32_t grid) const;

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<const SectionDecodeTables>> slots_;  // [section][grid]
};

}  // namespace cachegen::internal
