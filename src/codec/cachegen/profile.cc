// Model profiles: .cgprof parsing, writing, training and the registry
// (include/cachegen/profile.h; layout in docs/FORMAT.md ".cgprof").
#include "cachegen/profile.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen {
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
// Training: classes are quarter octaves of a channel's input spread against
// its coded scale, at most this many per stream kind.
constexpr int kClassesPerOctave = 4;
constexpr int kMaxTrainClasses = 16;
// Sensitivities are finite and within these bounds (KL per squared step).
constexpr float kMinSensitivity = 1e-30f, kMaxSensitivity = 1e30f;
constexpr size_t kHeaderBytes = 56;
constexpr uint32_t kMaxGridPoints = 64;
// Training grid: log2(step) from -7 to +2.75 in quarter octaves, which covers
// what rate control picks from about 0.5 to 8 bits/value.
constexpr int32_t kTrainGridFirst = -28;
constexpr uint32_t kTrainGridPoints = 40;
// Histogram bins for the tables (values >= 255 are escapes anyway).
constexpr size_t kTableBins = rans::kMaxAlphabet;

inline uint32_t ZigZag(int32_t q) { return (static_cast<uint32_t>(q) << 1) ^ static_cast<uint32_t>(q >> 31); }
inline int32_t UnZigZag(uint32_t u) { return static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1); }

std::vector<uint8_t> Serialize(const internal::ProfileData& d) {
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

Status Bad(const std::string& what) { return Status::Corrupt("profile: " + what); }

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

Result<internal::ProfileData> ParseData(std::span<const uint8_t> bytes) {
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

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<uint64_t, std::shared_ptr<const Profile>>& Registry() {
  static std::unordered_map<uint64_t, std::shared_ptr<const Profile>> r;
  return r;
}

// Moves a section's channel scales towards ∝ 1/sqrt(w_c), the high-rate
// optimum for a weighted squared error sum_c w_c e_c^2 (steps are scale *
// section step), within each head only, by a fraction f of the way in log:
//   log s'_c = log s_c + f (t_c - mean of t over c's head),
//   t_c = log(1 / sqrt(w_c)) - log s_c.
// Measured on stories260K (docs/EVAL.md, 60 windows): without key transforms
// f = 1/2 beat the whole rule (f = 1) and moving heads' mean scales too (one
// frame table serves a head's correlated channels, so spreading their
// resolutions costs rate the rule does not see, and the section sensitivities
// already weigh sections); in the decorrelated basis of a key transform the
// whole rule measured better (KL -48 % at 1.5 bits/value, within ±5 % at 2-4).
Status WeightChannelScales(const std::vector<double>& w, uint32_t head_dim, double f, std::vector<double>* var) {
  const size_t C = var->size();
  if (w.size() != C || head_dim == 0 || C % head_dim)
    return Status::InvalidArgument("profile: channel weights of another channel count");
  double max_w = 0;
  for (double v : w) {
    if (!(v >= 0 && std::isfinite(v))) return Status::InvalidArgument("profile: channel weights must be finite and >= 0");
    max_w = std::max(max_w, v);
  }
  if (max_w <= 0) return Status::InvalidArgument("profile: a section's channel weights are all zero");
  std::vector<double> log_sigma(C), t(C);
  for (size_t c = 0; c < C; ++c) {
    log_sigma[c] = 0.5 * std::log(std::max((*var)[c], 1e-60));
    t[c] = -0.5 * std::log(std::max(w[c], max_w * 1e-12)) - log_sigma[c];
  }
  for (size_t h = 0; h < C / head_dim; ++h) {
    double head = 0;
    for (size_t c = h * head_dim; c < (h + 1) * head_dim; ++c) head += t[c] / head_dim;
    for (size_t c = h * head_dim; c < (h + 1) * head_dim; ++c)
      (*var)[c] = std::exp(2 * (log_sigma[c] + f * (t[c] - head)));
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<const Profile>> Profile::Parse(std::span<const uint8_t> bytes) {
  CG_ASSIGN_OR_RETURN(internal::ProfileData d, ParseData(bytes));
  std::shared_ptr<Profile> p(new Profile());
  p->bytes_.assign(bytes.begin(), bytes.end());
  p->data_ = std::make_shared<const internal::ProfileData>(std::move(d));
  return std::shared_ptr<const Profile>(std::move(p));
}

uint64_t Profile::id() const {
  ByteReader r(std::span<const uint8_t>(bytes_).last(8));
  return r.U64();
}
uint32_t Profile::layers() const { return data_->layers; }
uint32_t Profile::kv_heads() const { return data_->kv_heads; }
uint32_t Profile::head_dim() const { return data_->head_dim; }
std::optional<CodecConfig::Quantizer> Profile::quantizer() const {
  using TablesFor = internal::ProfileData::TablesFor;
  switch (data_->tables_for) {
    case TablesFor::kUniform: return CodecConfig::Quantizer::kUniform;
    case TablesFor::kLloyd: return CodecConfig::Quantizer::kLloyd;
    case TablesFor::kUnknown: break;
  }
  return std::nullopt;
}

namespace {

// Per head, the covariance (D x D) of a section's rows [tokens][H * D],
// accumulated over calls.
struct HeadCovariance {
  uint32_t heads, dim;
  uint64_t n = 0;
  std::vector<double> sum, sum_xx;
  HeadCovariance(uint32_t h, uint32_t d) : heads(h), dim(d), sum(size_t{h} * d), sum_xx(size_t{h} * d * d) {}
  void Add(std::span<const float> rows) {
    const uint32_t D = dim, C = heads * dim;
    for (size_t t = 0; t < rows.size() / C; ++t, ++n)
      for (uint32_t h = 0; h < heads; ++h) {
        const float* x = &rows[t * C + size_t{h} * D];
        double* xx = &sum_xx[size_t{h} * D * D];
        for (uint32_t r = 0; r < D; ++r) {
          sum[size_t{h} * D + r] += x[r];
          for (uint32_t c = 0; c < D; ++c) xx[size_t{r} * D + c] += double(x[r]) * x[c];
        }
      }
  }
  std::vector<double> Of(uint32_t h) const {
    const uint32_t D = dim;
    std::vector<double> cov(size_t{D} * D);
    const double* mu = &sum[size_t{h} * D];
    for (uint32_t r = 0; r < D; ++r)
      for (uint32_t c = 0; c < D; ++c)
        cov[size_t{r} * D + c] = sum_xx[(size_t{h} * D + r) * D + c] / double(n) - mu[r] * mu[c] / (double(n) * n);
    return cov;
  }
};

// Per coded channel of one section, its weight diag(U^T M U) (diag(M)
// without a transform), M the head's weight matrix.
Result<std::vector<double>> CodedChannelWeights(const std::vector<double>& m, const internal::ProfileData& d,
                                                uint32_t section) {
  const uint32_t D = d.head_dim;
  if (m.size() != size_t{d.kv_heads} * D * D)
    return Status::InvalidArgument("profile: channel weights need a D x D matrix per KV head");
  std::vector<double> w(d.channels(), 0);
  for (uint32_t h = 0; h < d.kv_heads; ++h) {
    const double* mh = &m[size_t{h} * D * D];
    const float* u = d.HasTransform(section) ? &d.transform[section][size_t{h} * D * D] : nullptr;
    for (uint32_t c = 0; c < D; ++c) {
      double& wc = w[size_t{h} * D + c];
      if (!u) {
        wc = mh[size_t{c} * D + c];
        continue;
      }
      for (uint32_t r = 0; r < D; ++r)
        for (uint32_t q = 0; q < D; ++q) wc += double(u[size_t{r} * D + c]) * mh[size_t{r} * D + q] * u[size_t{q} * D + c];
      wc = std::max(wc, 0.0);  // M is positive semidefinite; rounding may leave -0
    }
  }
  return w;
}

// Classes of a K section's channels (ProfileTrainOptions::key_channel_classes)
// from its coding-domain rows of every context: per stream kind, the quarter
// octave of the RMS of the quantizer's inputs (anchors: x - mean; deltas: x -
// its group's first token) over the channel's coded scale. The symbols'
// distribution at a step depends on that ratio, so channels with equal ones
// can share a table at every grid point; at most kMaxTrainClasses per kind
// (octaves beyond them, from the median, join the outermost class).
void AssignChannelClasses(const std::vector<std::vector<float>>& rows, uint32_t sec, internal::ProfileData* d) {
  const uint32_t C = d->channels(), G = d->group_tokens;
  const std::array<float, 256>& sigma_table = SigmaTable();
  std::vector<double> sq[2] = {std::vector<double>(C, 0), std::vector<double>(C, 0)};
  uint64_t n[2] = {0, 0};
  for (const std::vector<float>& r : rows) {
    const size_t tokens = r.size() / C;
    for (size_t t = 0; t < tokens; ++t) {
      const float* x = &r[t * C];
      const float* first = &r[(t - t % G) * C];
      for (uint32_t c = 0; c < C; ++c) {
        const double mean = MeanFromCode(d->mean_code[sec][c], sigma_table[d->sigma_code[sec][c]]);
        const double a = x[c] - mean, e = x[c] - first[c];
        sq[0][c] += a * a;
        if (t % G) sq[1][c] += e * e;
      }
      ++n[0];
      n[1] += t % G ? 1 : 0;
    }
  }
  std::vector<uint8_t> cls(size_t{2} * C, 0);
  uint32_t count = 1;
  for (uint32_t kind = 0; kind < 2; ++kind) {
    if (n[kind] == 0) continue;
    std::vector<int> bin(C);
    for (uint32_t c = 0; c < C; ++c) {
      const double rms = std::sqrt(sq[kind][c] / double(n[kind]));
      const double sigma = sigma_table[d->sigma_code[sec][c]];
      bin[c] = static_cast<int>(std::floor(kClassesPerOctave * std::log2(std::max(rms, 1e-30) / sigma)));
    }
    std::vector<int> sorted = bin;
    std::sort(sorted.begin(), sorted.end());
    const int lo = sorted[C / 2] - kMaxTrainClasses / 2;
    for (int& b : bin) b = std::clamp(b, lo, lo + kMaxTrainClasses - 1);
    sorted = bin;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (uint32_t c = 0; c < C; ++c)
      cls[size_t{kind} * C + c] =
          static_cast<uint8_t>(std::lower_bound(sorted.begin(), sorted.end(), bin[c]) - sorted.begin());
    count = std::max(count, static_cast<uint32_t>(sorted.size()));
  }
  d->classes[sec] = static_cast<uint8_t>(count);
  d->class_of[sec] = std::move(cls);
}

}  // namespace

Result<std::shared_ptr<const Profile>> Profile::Train(std::span<const KVView> contexts, const CodecConfig& cfg,
                                                      const ProfileTrainOptions& options) {
  if (contexts.empty()) return Status::InvalidArgument("profile: no contexts to train on");
  const KVShape s0 = contexts[0].shape();
  internal::ProfileData d;
  d.layers = s0.layers;
  d.kv_heads = s0.kv_heads;
  d.head_dim = s0.head_dim;
  d.rotate = cfg.rotate && (s0.head_dim & (s0.head_dim - 1)) == 0;
  d.group_tokens = cfg.group_tokens ? cfg.group_tokens : kCacheGenDefaultGroupTokens;
  d.grid_first = kTrainGridFirst;
  d.grid_points = kTrainGridPoints;
  d.tables_for = cfg.quantizer == CodecConfig::Quantizer::kLloyd ? internal::ProfileData::TablesFor::kLloyd
                                                                 : internal::ProfileData::TablesFor::kUniform;
  if (cfg.rope.kind != RopeConfig::Kind::kNone) {
    d.rope = cfg.rope;
    if (d.rope.dims == 0) d.rope.dims = s0.head_dim;
    d.rope.freq_base = static_cast<float>(d.rope.freq_base);  // as frames store them
    d.rope.freq_scale = static_cast<float>(d.rope.freq_scale);
    CG_RETURN_IF_ERROR(ValidateRope(d.rope, s0.head_dim));
  }
  const uint32_t C = d.channels(), D = d.head_dim, sections = d.layers * 2;
  const auto& channel_weights = options.channel_weights;
  if (!(options.channel_weight_strength >= 0 && options.channel_weight_strength <= 1))
    return Status::InvalidArgument("profile: channel weight strength must be in [0, 1]");
  if (!channel_weights.empty() && (channel_weights.size() != sections || d.rotate))
    return Status::InvalidArgument("profile: channel weights need one set per section and no rotation");

  // Rows of every context in the coding domain: RoPE undone on keys, rotated
  // or transformed (once the section's transform is learned).
  auto coding_rows = [&](const KVView& kv, uint32_t section) {
    const KVShape& s = kv.shape();
    std::vector<float> rows(size_t{s.tokens} * C), x(D);
    const RopeTable* rope = nullptr;
    if (section % 2 == 0 && d.rope.kind != RopeConfig::Kind::kNone) rope = &CachedRopeTable(d.rope, 0, s.tokens);
    for (uint32_t t = 0; t < s.tokens; ++t) {
      float* row = &rows[size_t{t} * C];
      kv.ReadRow(section / 2, section % 2 ? KV::kValue : KV::kKey, t, row);
      for (uint32_t h = 0; h < d.kv_heads; ++h) {
        float* head = row + size_t{h} * D;
        if (rope) rope->Apply(t, head, /*inverse=*/true);
        if (d.rotate) HadamardInPlace(head, D);
        if (d.HasTransform(section)) {
          std::copy(head, head + D, x.begin());
          HeadToCoding(&d.transform[section][size_t{h} * D * D], x.data(), head, D);
        }
      }
    }
    return rows;
  };
  for (const KVView& kv : contexts) {
    const KVShape& s = kv.shape();
    if (s.layers != d.layers || s.kv_heads != d.kv_heads || s.head_dim != d.head_dim || s.tokens == 0)
      return Status::InvalidArgument("profile: contexts of different shapes (" + s.ToString() + " vs " +
                                     s0.ToString() + ")");
    d.tokens += s.tokens;
  }
  d.contexts = static_cast<uint32_t>(contexts.size());

  // Key transforms: the KLT of each head over all tokens of all contexts.
  if ((options.key_transform || options.value_transform) && !d.rotate) {
    d.transform.assign(sections, {});
    for (uint32_t sec = 0; sec < sections; ++sec) {
      if (!(sec % 2 ? options.value_transform : options.key_transform)) continue;
      HeadCovariance cov(d.kv_heads, D);
      for (const KVView& kv : contexts) cov.Add(coding_rows(kv, sec));
      std::vector<float>& u = d.transform[sec];
      for (uint32_t h = 0; h < d.kv_heads; ++h) {
        const std::vector<float> head = LearnHeadTransform(cov.Of(h), D);
        u.insert(u.end(), head.begin(), head.end());
      }
    }
  }

  // Channel statistics over all tokens of all contexts.
  d.sigma_code.assign(sections, std::vector<uint8_t>(C));
  d.mean_code.assign(sections, std::vector<int32_t>(C));
  for (uint32_t sec = 0; sec < sections; ++sec) {
    std::vector<double> sum(C, 0), sum_sq(C, 0);
    for (const KVView& kv : contexts) {
      const std::vector<float> rows = coding_rows(kv, sec);
      for (size_t i = 0; i < rows.size(); ++i) {
        sum[i % C] += rows[i];
        sum_sq[i % C] += double(rows[i]) * rows[i];
      }
    }
    std::vector<double> mean(C), var(C);
    for (uint32_t c = 0; c < C; ++c) {
      mean[c] = sum[c] / d.tokens;
      var[c] = sum_sq[c] / d.tokens - mean[c] * mean[c];
    }
    if (!channel_weights.empty() && !channel_weights[sec].empty()) {
      CG_ASSIGN_OR_RETURN(const std::vector<double> w, CodedChannelWeights(channel_weights[sec], d, sec));
      const double f = options.channel_weight_strength > 0 ? options.channel_weight_strength
                       : d.HasTransform(sec)                ? 1.0
                                                            : 0.5;
      CG_RETURN_IF_ERROR(WeightChannelScales(w, D, f, &var));
    }
    for (uint32_t c = 0; c < C; ++c) ChannelCodes(mean[c], var[c], &d.sigma_code[sec][c], &d.mean_code[sec][c]);
  }

  if (options.key_channel_classes || options.value_channel_classes) {
    d.classes.assign(sections, 0);
    d.class_of.assign(sections, {});
    for (uint32_t sec = 0; sec < sections; ++sec) {
      if (!(sec % 2 ? options.value_channel_classes : options.key_channel_classes)) continue;
      std::vector<std::vector<float>> rows;
      for (const KVView& kv : contexts) rows.push_back(coding_rows(kv, sec));
      AssignChannelClasses(rows, sec, &d);
    }
  }

  // Tables: symbol counts at every grid step with the profile's statistics,
  // per head or per channel class.
  std::vector<std::vector<uint64_t>> counts(d.IndexTables(), std::vector<uint64_t>(kTableBins, 0));
  std::vector<uint64_t> hist;
  for (const KVView& kv : contexts) {
    for (uint32_t sec = 0; sec < sections; ++sec) {
      SectionLayout l;
      l.tokens = kv.shape().tokens;
      l.kv_heads = d.kv_heads;
      l.head_dim = d.head_dim;
      l.group_tokens = d.group_tokens;
      l.rotate = false;  // rows are already in the coding domain
      l.recent_begin = l.tokens;
      l.profile = &d;  // its statistics (Histograms uses no tables)
      // Tables of the symbols frames will code (the learned quantizer is used on K sections only).
      l.lloyd = cfg.quantizer == CodecConfig::Quantizer::kLloyd && sec % 2 == 0;
      l.section = sec;
      const std::vector<float> rows = coding_rows(kv, sec);
      const SectionAnalysis a(l, rows);
      for (uint32_t g = 0; g < d.grid_points; ++g) {
        const float step = static_cast<float>(std::exp2(double(d.grid_first + int32_t(g)) / d.kGridPerOctave));
        for (uint32_t kind = 0; kind < 2; ++kind) {
          if (kind == 1 && d.group_tokens <= 1) continue;
          a.Histograms(step, /*use_delta=*/kind == 1, kTableBins, &hist, 1, /*per_channel=*/true);
          for (uint32_t c = 0; c < C; ++c) {
            const uint32_t h = c / D;
            const uint32_t unit = d.HasClasses(sec) ? d.class_of[sec][size_t{kind} * C + c] : h;
            auto& dst = counts[d.table_begin[sec] + (size_t{g} * d.TableUnits(sec) + unit) * 2 + kind];
            const uint64_t* src = &hist[((size_t{h} * 2 + kind) * D + c % D) * kTableBins];
            for (size_t v = 0; v < kTableBins; ++v) dst[v] += src[v];
          }
        }
      }
    }
  }
  d.tables.resize(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) d.tables[i] = rans::MakeFreqTable(counts[i]);
  std::vector<uint8_t> bytes = Serialize(d);
  return Parse(bytes);
}

Result<std::shared_ptr<const Profile>> Profile::WithSensitivity(std::span<const float> per_section,
                                                                const SensitivityCurve& curve) const {
  if (per_section.size() != size_t{data_->layers} * 2)
    return Status::InvalidArgument("profile: " + std::to_string(per_section.size()) + " sensitivities for " +
                                   std::to_string(data_->layers * 2) + " sections");
  for (float v : per_section)
    if (!(v >= kMinSensitivity && v <= kMaxSensitivity))
      return Status::InvalidArgument("profile: sensitivity " + std::to_string(v) + " out of range");
  if (!curve.steps.empty() && !ValidCurve(curve.steps, curve.kl, data_->layers * 2))
    return Status::InvalidArgument("profile: invalid sensitivity curve (2 to 16 rising positive steps, KL finite and >= 0)");
  if (!(curve.q8_kl >= 0 && curve.q8_kl <= kMaxSensitivity) || (curve.q8_kl > 0 && curve.steps.empty()))
    return Status::InvalidArgument("profile: the q8 reference KL must be finite, >= 0, and come with a curve");
  if (!ValidJoint(curve.joint_predicted, curve.joint_measured) ||
      (!curve.joint_predicted.empty() && curve.steps.empty()))
    return Status::InvalidArgument(
        "profile: a joint calibration needs a curve, at most 16 rising predictions > 0 and measured KL > 0");
  internal::ProfileData d = *data_;
  d.sensitivity.assign(per_section.begin(), per_section.end());
  d.curve_steps = curve.steps;
  d.curve_kl = curve.kl;
  d.q8_kl = curve.q8_kl;
  d.joint_predicted = curve.joint_predicted;
  d.joint_measured = curve.joint_measured;
  return Parse(Serialize(d));
}

void RegisterProfile(std::shared_ptr<const Profile> profile) {
  if (!profile) return;
  std::lock_guard lock(RegistryMutex());
  Registry().emplace(profile->id(), std::move(profile));
}

std::shared_ptr<const Profile> FindProfile(uint64_t id) {
  std::lock_guard lock(RegistryMutex());
  auto it = Registry().find(id);
  return it == Registry().end() ? nullptr : it->second;
}

}  // namespace cachegen
