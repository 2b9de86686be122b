// A model profile's entropy tables in the decoders' form, built once per
// (section, grid point) on first use and kept with the profile, so a frame's
// table-form streams (FORMAT.md "Symbol streams", mode 3) decode without
// building a 4096-entry table per stream: a section with channel classes has
// up to 32 tables, each as large as the section's symbols at low rates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
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
  // Per [kind][channel]: where its table starts in `values` (entries; its
  // table in `symbols` is that / kProbScale) and that table's escape symbol.
  std::vector<int32_t> channel_offset;
  std::vector<uint32_t> channel_escape;

  size_t bytes() const {
    return symbols.size() * sizeof(rans::DecodeTable) + values.size() * 4 + channel_offset.size() * 8;
  }
  const rans::DecodeTable* Symbols(uint32_t kind, uint32_t channel) const {
    return &symbols[size_t(channel_offset[size_t{kind} * channels + channel]) / rans::kProbScale];
  }
  const uint32_t* Values(uint32_t unit, uint32_t kind) const {
    return values.data() + (size_t{unit} * 2 + kind) * rans::kProbScale;
  }
};

// The cache a ProfileData holds: thread-safe, filled lazily, at most
// kProfileDecodeTablesBytes per profile (the least recently used entries go
// first; a decode holding one keeps it alive). Copies start empty (the tables
// are derived from the profile's bytes).
constexpr size_t kProfileDecodeTablesBytes = size_t{64} << 20;

class ProfileDecodeTables {
 public:
  explicit ProfileDecodeTables(size_t budget_bytes = kProfileDecodeTablesBytes) : budget_(budget_bytes) {}
  ProfileDecodeTables(const ProfileDecodeTables& other) : budget_(other.budget_) {}
  ProfileDecodeTables& operator=(const ProfileDecodeTables& other) {
    budget_ = other.budget_;
    return *this;
  }

  // The tables of (section, grid point) of `profile` (which holds this
  // cache); grid < profile.grid_points, section < 2 * layers.
  std::shared_ptr<const SectionDecodeTables> Get(const ProfileData& profile, uint32_t section, uint32_t grid) const;
  // Bytes of the tables cached now (tests).
  size_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const SectionDecodeTables> tables;
    uint64_t last_use = 0;
  };
  size_t budget_;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, Entry> entries_;  // key section * 2^32 + grid
  mutable size_t bytes_ = 0;
  mutable uint64_t uses_ = 0;
};

}  // namespace cachegen::internal
