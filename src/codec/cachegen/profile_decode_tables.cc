#include "codec/cachegen/profile_decode_tables.h"

#include "codec/cachegen/profile_data.h"

namespace cachegen::internal {

namespace {

std::shared_ptr<const SectionDecodeTables> Build(const ProfileData& p, uint32_t section, uint32_t grid) {
  auto t = std::make_shared<SectionDecodeTables>();
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
  t->channel_offset.resize(size_t{2} * C);
  t->channel_escape.resize(size_t{2} * C);
  for (uint32_t kind = 0; kind < 2; ++kind)
    for (uint32_t c = 0; c < C; ++c) {
      const uint32_t unit = p.HasClasses(section) ? p.class_of[section][size_t{kind} * C + c] : c / p.head_dim;
      t->channel_offset[size_t{kind} * C + c] = static_cast<int32_t>((size_t{unit} * 2 + kind) * rans::kProbScale);
      t->channel_escape[size_t{kind} * C + c] = p.Table(section, grid, unit, kind).escape;
    }
  return t;
}

}  // namespace

std::shared_ptr<const SectionDecodeTables> ProfileDecodeTables::Get(const ProfileData& profile, uint32_t section,
                                                                    uint32_t grid) const {
  const uint64_t key = (uint64_t{section} << 32) | grid;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[key];
  e.last_use = ++uses_;
  if (e.tables) return e.tables;
  e.tables = Build(profile, section, grid);
  bytes_ += e.tables->bytes();
  std::shared_ptr<const SectionDecodeTables> out = e.tables;
  // Over budget: drop the least recently used other entries.
  while (bytes_ > budget_ && entries_.size() > 1) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first != key && (oldest == entries_.end() || it->second.last_use < oldest->second.last_use)) oldest = it;
    bytes_ -= oldest->second.tables->bytes();
    entries_.erase(oldest);
  }
  return out;
}

size_t ProfileDecodeTables::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace cachegen::internal
