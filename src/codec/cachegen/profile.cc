// Model profiles: training and the registry (.cgprof reading and writing:
// profile_format.cc)
// (include/cachegen/profile.h; layout in docs/FORMAT.md ".cgprof").
#include "cachegen/profile.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen {
namespace {

// Training: classes are quarter octaves of a channel's input spread against
// its coded scale, at most this many per stream kind.
constexpr int kClassesPerOctave = 4;
constexpr int kMaxTrainClasses = 16;
// Training grid: log2(step) from -7 to +2.75 in quarter octaves, which covers
// what rate control picks from about 0.5 to 8 bits/value.
constexpr int32_t kTrainGridFirst = -28;
constexpr uint32_t kTrainGridPoints = 40;
// Histogram bins for the tables (values >= 255 are escapes anyway).
constexpr size_t kTableBins = rans::kMaxAlphabet;

// Moves a section's channel scales towards ∝ 1/sqrt(w_c), the high-rate
// optimum for a weighted squared error sum_c w_c e_c^2 (steps are scale *
// section step), within each head only, by a fraction f of the way in log:
//   log s'_c = log s_c + f (t_c - mean of t over c's head),
//   t_c = log(1 / sqrt(w_c)) - log s_c.
// Measured on stories260K (docs/results/eval.md, 60 windows): without key transforms
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
  CG_ASSIGN_OR_RETURN(internal::ProfileData d, internal::ParseProfile(bytes));
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
  std::vector<uint8_t> bytes = internal::SerializeProfile(d);
  return Parse(bytes);
}

Result<std::shared_ptr<const Profile>> Profile::WithSensitivity(std::span<const float> per_section,
                                                                const SensitivityCurve& curve) const {
  if (per_section.size() != size_t{data_->layers} * 2)
    return Status::InvalidArgument("profile: " + std::to_string(per_section.size()) + " sensitivities for " +
                                   std::to_string(data_->layers * 2) + " sections");
  for (float v : per_section)
    if (!(v >= internal::kMinSensitivity && v <= internal::kMaxSensitivity))
      return Status::InvalidArgument("profile: sensitivity " + std::to_string(v) + " out of range");
  if (!curve.steps.empty() && !internal::ValidCurve(curve.steps, curve.kl, data_->layers * 2))
    return Status::InvalidArgument("profile: invalid sensitivity curve (2 to 16 rising positive steps, KL finite and >= 0)");
  if (!(curve.q8_kl >= 0 && curve.q8_kl <= internal::kMaxSensitivity) || (curve.q8_kl > 0 && curve.steps.empty()))
    return Status::InvalidArgument("profile: the q8 reference KL must be finite, >= 0, and come with a curve");
  if (!internal::ValidJoint(curve.joint_predicted, curve.joint_measured) ||
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
  return Parse(internal::SerializeProfile(d));
}

void ProfileSet::Add(std::shared_ptr<const Profile> profile) {
  if (!profile) return;
  std::lock_guard lock(mu_);
  by_id_.emplace(profile->id(), std::move(profile));
}

std::shared_ptr<const Profile> ProfileSet::Find(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

size_t ProfileSet::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

}  // namespace cachegen
