#include "codec/cachegen/profile_decode_tables.h"

#include "codec/cachegen/profile_data.h"

namespace cachegen::internal {

namespace {

std::unique_ptr<const SectionDecodeTables> Build(const ProfileData& p, uint32_t section, uint32_t grid) {
  auto t = std::make_unique<SectionDecodeTables>();
  const uint32_t C = p.channels();
  t->units = p.TableUnits(section);
  t->channels = C;
  t->symbols.resize(size_t{t->units} * 2);
  t->values.resize(size_t{t->units} * 2 * rans::kProbScale);
  for (uint32_t u = 0; u < t->units; ++u)
    for (uint32_t kind = 0; kind < 2; ++kind) {
      const rans::FreqTable& f = p.Table(section, grid, u, kind);
      rans::BuildDecodeTable(f, &t->symbols[size_t{u} * 2 + kind]);
      rans::BuildValueTable(f, t->values.data() + (size_t{u} * 2 + kind) * rans::kProbScale);
    }
  t->channel_table.resize(size_t{2} * C);
  t->channel_escape.resize(size_t{2} * C);
  for (uint32_t kind = 0; kind < 2; ++kind)
    for (uint32_t c = 0; c < C; ++c) {
      const uint32_t unit = p.HasClasses(section) ? p.class_of[section][size_t{kind} * C + c] : c / p.head_dim;
      t->channel_table[size_t{kind} * C + c] = unit * 2 + kind;
      t->channel_escape[size_t{kind} * C + c] = p.Table(section, grid, unit, kind).escape;
    }
  return t;
}

}  // namespace

const SectionDecodeTables& ProfileDecodeTables::Get(const ProfileData& profile, uint32_t section,
                                                    uint32_t grid) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = size_t{profile.layers} * 2 * profile.grid_points;
  if (slots_.size() < n) slots_.resize(n);
  auto& slot = slots_[size_t{section} * profile.grid_points + grid];
  if (!slot) slot = Build(profile, section, grid);
  return *slot;
}

}  // namespace cachegen::internal
