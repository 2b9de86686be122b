// The .cgprof file format (docs/FORMAT.md ".cgprof"): writing and
// validating parsing of a model profile's bytes.
#include <algorithm>
#include <cmath>
#include <string>

#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_format.h"
#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen::internal {
namespace {

constexpr uint32_t kMagic = 0x46504743;  // "CGPF"
// Version 1: statistics and tables. Version 2 adds blocks named by flag
// bits (sensitivities), version 3 one more (learned head transforms); a
// profile is written with the lowest version that holds its blocks.
constexpr uint16_t kVersion1 = 1;
constexpr uint16_t kVersion2 = 2;
constexpr uint16_t kVersion3 = 3;
constexpr uint16_t kVersion4 = 4;
constexpr uint16_t kVersion5 = 5;
constexpr uint16_t kFlagSensitivity = 1;
constexpr uint16_t kFlagTransforms = 2;
constexpr uint16_t kFlagLloydTables = 4;  // version 3: K tables of the learned quantizer (else uniform)
constexpr uint16_t kFlagChannelClasses = 8;  // version 4: per section a class count (and classes)
constexpr uint16_t kFlagSensitivityCurve = 16;  // version 5: per section measured KL at a list of steps
// A sensitivity curve has this many steps at most (and at least 2).
constexpr uint32_t kMaxCurvePoints = 16;
// Classes a section may have (training makes at most 16 per stream kind).
constexpr uint32_t kMaxClasses = 64;
constexpr size_t kHeaderBytes = 56;
constexpr uint32_t kMaxGridPoints = 64;

}  // namespace

std::vector<uint8_t> SerializeProfile(const ProfileData& d) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kMagic);
  const bool sens = !d.sensitivity.empty();
  const bool transforms = std::any_of(d.transform.begin(), d.transform.end(), [](auto& t) { return !t.empty(); });
  // Version 3 records the quantizer; a profile that does not know it stays at 1 or 2.
  const bool v3 = transforms || d.tables_for != internal::ProfileData::TablesFor::kUnknown;
  const bool lloyd = d.tables_for == internal::ProfileData::TablesFor::kLloyd;
  const bool classes = std::any_of(d.classes.begin(), d.classes.end(), [](uint8_t n) { return n > 0; });
  const bool curve = sens && !d.curve_steps.empty();
  w.U16(curve ? kVersion5 : classes ? kVersion4 : v3 ? kVersion3 : sens ? kVersion2 : kVersion1);
  w.U16((sens ? kFlagSensitivity : 0) | (transforms ? kFlagTransforms : 0) | (lloyd ? kFlagLloydTables : 0) |
        (classes ? kFlagChannelClasses : 0) | (curve ? kFlagSensitivityCurve : 0));
  w.U32(d.layers);
  w.U32(d.kv_heads);
  w.U32(d.head_dim);
  w.U8(d.rotate ? 1 : 0);
  w.U8(static_cast<uint8_t>(d.rope.kind));
  w.U16(0);
  const bool rope = d.rope.kind != RopeConfig::Kind::kNone;
  w.U32(rope ? d.rope.dims : 0);
  w.F32(rope ? static_cast<float>(d.rope.freq_base) : 0.0f);
  w.F32(rope ? static_cast<float>(d.rope.freq_scale) : 0.0f);
  w.U32(d.group_tokens);
  w.U32(static_cast<uint32_t>(d.grid_first));
  w.U32(d.grid_points);
  w.U32(d.contexts);
  w.U32(d.tokens);
  const uint32_t C = d.channels();
  for (uint32_t s = 0; s < d.layers * 2; ++s) {
    for (uint32_t c = 0; c < C; ++c) w.U8(d.sigma_code[s][c]);
    for (uint32_t c = 0; c < C; ++c) w.Varint(ZigZag(d.mean_code[s][c]));
    if (classes) {
      w.U8(d.HasClasses(s) ? d.classes[s] : 0);
      if (d.HasClasses(s)) w.Bytes(d.class_of[s]);
    }
    for (uint32_t g = 0; g < d.grid_points; ++g)
      for (uint32_t u = 0; u < d.TableUnits(s); ++u)
        for (uint32_t k = 0; k < 2; ++k) {
          const rans::FreqTable& t = d.Table(s, g, u, k);
          w.U8(static_cast<uint8_t>(t.escape));
          for (uint32_t v = 0; v <= t.escape; ++v) w.Varint(t.freq[v]);
        }
  }
  for (float v : d.sensitivity) w.F32(v);
  if (transforms)
    for (uint32_t sec = 0; sec < d.layers * 2; ++sec) {
      w.U8(d.HasTransform(sec) ? 1 : 0);
      if (d.HasTransform(sec))
        for (float v : d.transform[sec]) w.F32(v);
    }
  if (curve) {
    w.U8(static_cast<uint8_t>(d.curve_steps.size()));
    for (float v : d.curve_steps) w.F32(v);
    for (float v : d.curve_kl) w.F32(v);
    w.F32(d.q8_kl);
    w.U8(static_cast<uint8_t>(d.joint_predicted.size()));
    for (float v : d.joint_predicted) w.F32(v);
    for (float v : d.joint_measured) w.F32(v);
  }
  w.U64(Checksum64(out));
  return out;
}

// A sensitivity curve's steps: 2..kMaxCurvePoints, finite, positive, rising;
// its KL values (sections x steps): finite and in [0, kMaxSensitivity].
bool ValidCurve(std::span<const float> steps, std::span<const float> kl, uint32_t sections) {
  if (steps.size() < 2 || steps.size() > kMaxCurvePoints || kl.size() != steps.size() * sections) return false;
  for (size_t i = 0; i < steps.size(); ++i)
    if (!(steps[i] > 0 && steps[i] <= 1e6f) || (i > 0 && !(steps[i] > steps[i - 1]))) return false;
  return std::all_of(kl.begin(), kl.end(), [](float v) { return v >= 0 && v <= kMaxSensitivity; });
}

// A joint calibration: at most kMaxCurvePoints predictions, finite, > 0 and
// rising, each with a measured KL, finite and in (0, kMaxSensitivity].
bool ValidJoint(std::span<const float> predicted, std::span<const float> measured) {
  if (predicted.size() != measured.size() || predicted.size() > kMaxCurvePoints) return false;
  for (size_t i = 0; i < predicted.size(); ++i) {
    if (!(predicted[i] > 0 && predicted[i] <= kMaxSensitivity) || (i > 0 && !(predicted[i] > predicted[i - 1])))
      return false;
    if (!(measured[i] > 0 && measured[i] <= kMaxSensitivity)) return false;
  }
  return true;
}

namespace {

Status Bad(const std::string& what) { return Status::Corrupt("profile: " + what); }

Status ParseCurve(ByteReader& r, internal::ProfileData* d) {
  const uint32_t points = r.U8(), sections = d->layers * 2;
  if (!r.ok() || points < 2 || points > kMaxCurvePoints) return Bad("invalid sensitivity curve length");
  if (r.remaining() < (uint64_t{points} * (sections + 1) + 1) * 4 + 1) return Bad("truncated sensitivity curve");
  d->curve_steps.resize(points);
  for (float& v : d->curve_steps) v = r.F32();
  d->curve_kl.resize(size_t{points} * sections);
  for (float& v : d->curve_kl) v = r.F32();
  if (!ValidCurve(d->curve_steps, d->curve_kl, sections)) return Bad("invalid sensitivity curve values");
  d->q8_kl = r.F32();
  if (!r.ok() || !(d->q8_kl >= 0 && d->q8_kl <= kMaxSensitivity)) return Bad("invalid q8 reference KL");
  const uint32_t joint = r.U8();
  if (!r.ok() || joint > kMaxCurvePoints || r.remaining() < uint64_t{joint} * 8) return Bad("invalid joint calibration");
  d->joint_predicted.resize(joint);
  d->joint_measured.resize(joint);
  for (float& v : d->joint_predicted) v = r.F32();
  for (float& v : d->joint_measured) v = r.F32();
  if (!ValidJoint(d->joint_predicted, d->joint_measured)) return Bad("invalid joint calibration values");
  return Status::Ok();
}

// The transforms block: per section a presence byte, then H matrices of D x D f32.
Status ParseTransforms(ByteReader& r, internal::ProfileData* d) {
  const uint32_t sections = d->layers * 2, D = d->head_dim;
  const uint64_t per_section = uint64_t{d->kv_heads} * D * D;
  d->transform.assign(sections, {});
  d->transform_t.assign(sections, {});
  bool any = false;
  for (uint32_t sec = 0; sec < sections; ++sec) {
    const uint8_t present = r.U8();
    if (!r.ok() || present > 1) return Bad("invalid head transform presence byte");
    if (!present) continue;
    if (r.remaining() < per_section * 4) return Bad("truncated head transforms");
    std::vector<float>& u = d->transform[sec];
    u.resize(per_section);
    for (float& v : u) v = r.F32();
    std::vector<float>& ut = d->transform_t[sec];
    ut.resize(per_section);
    for (uint32_t h = 0; h < d->kv_heads; ++h) {
      const std::span<const float> head = std::span<const float>(u).subspan(size_t{h} * D * D, size_t{D} * D);
      const Status st = CheckHeadTransform(head, D);
      if (!st.ok()) return Bad(st.message());
      const std::vector<float> t = Transposed(head, D);
      std::copy(t.begin(), t.end(), ut.begin() + size_t{h} * D * D);
    }
    any = true;
  }
  if (!any) return Bad("transforms flag without a transform");
  return Status::Ok();
}

// A section's class count and (when not 0) its channels' classes per stream kind.
Status ParseClasses(ByteReader& r, uint32_t section, internal::ProfileData* d) {
  const uint32_t n = r.U8();
  if (!r.ok()) return Bad("truncated channel classes");
  if (n > kMaxClasses) return Bad("more than " + std::to_string(kMaxClasses) + " channel classes");
  d->classes[section] = static_cast<uint8_t>(n);
  if (n == 0) return Status::Ok();
  const auto bytes = r.Bytes(size_t{2} * d->channels());
  if (!r.ok()) return Bad("truncated channel classes");
  for (uint8_t c : bytes)
    if (c >= n) return Bad("channel class out of range");
  d->class_of[section].assign(bytes.begin(), bytes.end());
  return Status::Ok();
}

}  // namespace

Result<ProfileData> ParseProfile(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes + 8) return Bad("truncated (" + std::to_string(bytes.size()) + " bytes)");
  ByteReader r(bytes);
  if (r.U32() != kMagic) return Bad("wrong magic (not a .cgprof)");
  const uint16_t version = r.U16();
  if (version == 0) return Bad("version 0");
  if (version > kVersion5)
    return Status::Unsupported("profile format version " + std::to_string(version) +
                               " is newer than the supported version 5");
  const std::span<const uint8_t> body = bytes.first(bytes.size() - 8);
  ByteReader tail(bytes.subspan(bytes.size() - 8));
  if (tail.U64() != Checksum64(body)) return Bad("checksum mismatch");
  internal::ProfileData d;
  const uint16_t flags = r.U16();
  d.layers = r.U32();
  d.kv_heads = r.U32();
  d.head_dim = r.U32();
  const uint8_t rotate = r.U8();
  const uint8_t kind = r.U8();
  const uint16_t reserved = r.U16();
  d.rope.dims = r.U32();
  d.rope.freq_base = r.F32();
  d.rope.freq_scale = r.F32();
  d.group_tokens = r.U32();
  d.grid_first = static_cast<int32_t>(r.U32());
  d.grid_points = r.U32();
  d.contexts = r.U32();
  d.tokens = r.U32();
  const uint16_t known = version == kVersion1   ? 0
                         : version == kVersion2 ? kFlagSensitivity
                         : version == kVersion3 ? kFlagSensitivity | kFlagTransforms | kFlagLloydTables
                         : version == kVersion4 ? kFlagSensitivity | kFlagTransforms | kFlagLloydTables |
                                                      kFlagChannelClasses
                                                : kFlagSensitivity | kFlagTransforms | kFlagLloydTables |
                                                      kFlagChannelClasses | kFlagSensitivityCurve;
  if ((flags & ~known) != 0 || reserved != 0) return Bad("unknown flags or reserved bits set");
  if ((flags & kFlagSensitivityCurve) && !(flags & kFlagSensitivity)) return Bad("sensitivity curve without sensitivities");
  if (version >= kVersion3)
    d.tables_for = flags & kFlagLloydTables ? internal::ProfileData::TablesFor::kLloyd
                                            : internal::ProfileData::TablesFor::kUniform;
  if (rotate > 1) return Bad("invalid rotate byte");
  d.rotate = rotate;
  if (d.layers == 0 || d.layers > 4096 || d.kv_heads == 0 || d.kv_heads > 4096 || d.head_dim == 0 ||
      d.head_dim > 4096 || uint64_t{d.kv_heads} * d.head_dim > 65536)
    return Bad("shape out of limits");
  if (d.rotate && (d.head_dim & (d.head_dim - 1)) != 0) return Bad("rotation needs a power-of-two head dim");
  if (d.rotate && (flags & kFlagTransforms)) return Bad("head transforms with rotation");
  if (kind > 2) return Bad("unknown RoPE kind " + std::to_string(kind));
  d.rope.kind = static_cast<RopeConfig::Kind>(kind);
  if (d.rope.kind == RopeConfig::Kind::kNone) {
    if (d.rope.dims != 0 || d.rope.freq_base != 0 || d.rope.freq_scale != 0) return Bad("RoPE fields set without RoPE");
  } else if (!ValidateRope(d.rope, d.head_dim).ok()) {
    return Bad("invalid RoPE fields");
  }
  if (d.group_tokens == 0) return Bad("group size 0");
  if (d.grid_points == 0 || d.grid_points > kMaxGridPoints || d.grid_first < -128 || d.grid_first > 128)
    return Bad("step grid out of limits");
  // Least bytes the rest takes (a scale byte and a mean byte per channel, 4
  // bytes per table of per-head sections), checked before anything is
  // allocated; sections with classes are checked as they come.
  const uint64_t C = d.channels(), sections = uint64_t{d.layers} * 2;
  const bool has_classes = flags & kFlagChannelClasses;
  const uint64_t n_tables = has_classes ? 0 : sections * d.grid_points * d.kv_heads * 2;
  const uint64_t sens_bytes = (flags & kFlagSensitivity) ? sections * 4 : 0;
  if (r.remaining() < 8 || r.remaining() - 8 < sections * 2 * C + n_tables * 4 + sens_bytes)
    return Bad("truncated body");
  d.sigma_code.resize(sections);
  d.mean_code.resize(sections);
  if (has_classes) {
    d.classes.assign(sections, 0);
    d.class_of.assign(sections, {});
  }
  for (uint64_t s = 0; s < sections; ++s) {
    auto codes = r.Bytes(C);
    if (!r.ok()) return Bad("truncated channel scales");
    d.sigma_code[s].assign(codes.begin(), codes.end());
    d.mean_code[s].resize(C);
    for (uint64_t c = 0; c < C; ++c) {
      const uint64_t z = r.Varint();
      if (!r.ok() || z > (uint64_t{1} << 31)) return Bad("invalid channel mean");
      d.mean_code[s][c] = UnZigZag(static_cast<uint32_t>(z));
    }
    if (has_classes) CG_RETURN_IF_ERROR(ParseClasses(r, static_cast<uint32_t>(s), &d));
    const uint64_t section_tables = uint64_t{d.grid_points} * d.TableUnits(static_cast<uint32_t>(s)) * 2;
    if (r.remaining() < section_tables * 4) return Bad("truncated tables");
    for (uint64_t k = 0; k < section_tables; ++k) {
      rans::FreqTable& t = d.tables.emplace_back();
      t.escape = r.U8();
      if (!r.ok() || t.escape < 2) return Bad("invalid table escape threshold");
      uint32_t sum = 0;
      for (uint32_t v = 0; v <= t.escape; ++v) {
        const uint64_t f = r.Varint();
        if (!r.ok() || f == 0 || f > rans::kProbScale) return Bad("invalid table frequency");
        t.freq[v] = static_cast<uint32_t>(f);
        sum += t.freq[v];
      }
      if (sum != rans::kProbScale) return Bad("table frequencies do not sum to 4096");
    }
  }
  if (flags & kFlagSensitivity) {
    d.sensitivity.resize(sections);
    for (float& v : d.sensitivity) {
      v = r.F32();
      if (!r.ok()) return Bad("truncated sensitivities");
      if (!(v >= kMinSensitivity && v <= kMaxSensitivity)) return Bad("sensitivity out of range");
    }
  }
  if (flags & kFlagTransforms) CG_RETURN_IF_ERROR(ParseTransforms(r, &d));
  if (flags & kFlagSensitivityCurve) CG_RETURN_IF_ERROR(ParseCurve(r, &d));
  if (r.remaining() != 8) return Bad("trailing bytes before the checksum");
  if (has_classes && std::none_of(d.classes.begin(), d.classes.end(), [](uint8_t n) { return n > 0; }))
    return Bad("channel classes flag without a section with classes");
  d.IndexTables();
  return d;
}

}  // namespace cachegen::internal
