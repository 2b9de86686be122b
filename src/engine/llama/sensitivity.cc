#include "engine/llama/sensitivity.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "engine/llama/eval.h"

namespace cachegen::engine {
namespace {

// Writes section `sec` of `src` into `dst` as a frame with the profile would
// reconstruct it at `step` (encode then decode: deltas, tables, codebook and
// RoPE handling included).
Status QuantizeSection(const internal::ProfileData& d, bool lloyd, uint32_t sec, float step, const KVView& src,
                       const KVView& dst) {
  const KVShape& s = src.shape();
  const uint32_t C = d.channels(), D = d.head_dim, layer = sec / 2;
  const KV kv = sec % 2 ? KV::kValue : KV::kKey;
  std::optional<RopeTable> rope;
  if (kv == KV::kKey && d.rope.kind != RopeConfig::Kind::kNone) rope.emplace(d.rope, 0, s.tokens);
  std::vector<float> rows(size_t{s.tokens} * C);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    float* row = &rows[size_t{t} * C];
    src.ReadRow(layer, kv, t, row);
    if (rope)
      for (uint32_t h = 0; h < d.kv_heads; ++h) rope->Apply(t, row + size_t{h} * D, /*inverse=*/true);
  }
  SectionLayout l;
  l.tokens = s.tokens;
  l.kv_heads = d.kv_heads;
  l.head_dim = D;
  l.group_tokens = d.group_tokens;
  l.rotate = d.rotate;
  l.recent_begin = s.tokens;
  l.profile = &d;
  l.section = sec;
  l.SetProfileTransform();
  l.lloyd = lloyd && kv == KV::kKey;  // as the encoder uses it
  const SectionAnalysis a(l, rows);
  std::vector<uint8_t> payload;
  uint32_t side = 0;
  a.Encode(step, a.PreferDelta(step), &payload, &side);
  return DecodeCacheGenSection(l, payload, SectionSink{dst, layer, kv, rope ? &*rope : nullptr});
}

double MeanKL(const std::vector<std::vector<float>>& exact, const std::vector<std::vector<float>>& got) {
  double sum = 0;
  for (size_t i = 0; i < got.size(); ++i) sum += KLDivergence(exact[i], got[i]);
  return sum;
}

// The joint pass: every section at once at m x its step factor, per
// multiplier of o.joint_multipliers (after the weights, which set the factors).
Status MeasureJoint(LlamaContext& ctx, std::span<const std::vector<int32_t>> windows, const internal::ProfileData& d,
                    bool lloyd, const SensitivityOptions& o, SensitivityReport* rep) {
  const uint32_t N = o.context, M = o.continuation, sections = d.layers * 2;
  const std::vector<float> f = internal::ProfileData::StepFactors(rep->weights);
  rep->joint_multipliers = o.joint_multipliers;
  rep->joint_kl.assign(o.joint_multipliers.size(), 0);
  if (o.joint_multipliers.empty()) return Status::Ok();
  std::vector<std::vector<float>> exact, got;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const std::vector<int32_t>& w = windows[wi];
    ctx.Clear();
    CG_RETURN_IF_ERROR(ctx.Eval(std::span<const int32_t>(w).first(N), 0));
    CG_ASSIGN_OR_RETURN(CapturedKV cap, ctx.Capture(0));
    CG_RETURN_IF_ERROR(ctx.Inject(0, cap.kv.view(), cap.positions));
    CG_RETURN_IF_ERROR(TeacherForcedLogProbs(ctx, w, N, M, &exact));
    KVTensor work = cap.kv;
    for (size_t j = 0; j < o.joint_multipliers.size(); ++j) {
      for (uint32_t sec = 0; sec < sections; ++sec)
        CG_RETURN_IF_ERROR(QuantizeSection(d, lloyd, sec, static_cast<float>(o.joint_multipliers[j] * f[sec]),
                                           cap.kv.view(), work.view()));
      CG_RETURN_IF_ERROR(ctx.Inject(0, work.view(), cap.positions));
      CG_RETURN_IF_ERROR(TeacherForcedLogProbs(ctx, w, N, M, &got));
      rep->joint_kl[j] += MeanKL(exact, got);
    }
    if (o.progress) o.progress(fmt::format("sensitivity: joint calibration, window {}/{} done", wi + 1, windows.size()));
  }
  for (double& kl : rep->joint_kl) kl /= double(windows.size()) * M;
  return Status::Ok();
}

}  // namespace

Result<SensitivityReport> MeasureSensitivity(const std::shared_ptr<LlamaModel>& model,
                                             std::span<const std::vector<int32_t>> windows, const Profile& profile,
                                             const CodecConfig& config, const SensitivityOptions& o) {
  const internal::ProfileData& d = profile.data();
  const LlamaModelInfo& info = model->info();
  if (info.layers != d.layers || info.kv_heads != d.kv_heads || info.head_dim != d.head_dim)
    return Status::InvalidArgument("sensitivity: the profile's shape differs from the model's");
  if (o.steps.empty() || windows.empty() || o.continuation == 0)
    return Status::InvalidArgument("sensitivity: no steps, windows or scored tokens");
  for (double s : o.steps)
    if (!(s > 0 && s < 1e6)) return Status::InvalidArgument("sensitivity: steps must be in (0, 1e6)");
  if (o.steps.size() > 16 || std::adjacent_find(o.steps.begin(), o.steps.end(), std::greater_equal<>()) != o.steps.end())
    return Status::InvalidArgument("sensitivity: at most 16 steps, each larger than the one before");
  const auto& jm = o.joint_multipliers;
  if (jm.size() > 16 || std::adjacent_find(jm.begin(), jm.end(), std::greater_equal<>()) != jm.end() ||
      std::any_of(jm.begin(), jm.end(), [](double m) { return !(m > 0 && m < 1e6); }))
    return Status::InvalidArgument("sensitivity: at most 16 joint multipliers in (0, 1e6), each larger than the one before");
  const uint32_t N = o.context, M = o.continuation, sections = d.layers * 2;
  LlamaContextOptions co;
  co.n_ctx = N + M + 8;
  co.threads = o.threads;
  co.cache = o.cache;
  co.model_basis = true;  // as the codec codes it (profile_train)
  CG_ASSIGN_OR_RETURN(auto ctx, LlamaContext::Create(model, co));
  const bool lloyd = config.quantizer == CodecConfig::Quantizer::kLloyd;

  // The 8-bit reference: llama.cpp's own q8_0 cache where the model runs it
  // (a head dim that 32 divides; flash attention, as llama.cpp needs for a
  // quantized V), else the q8 codec on the captured KV.
  LlamaContextOptions qo = co;
  qo.cache = {"q8_0", "q8_0"};
  qo.flash_attn = 1;
  Result<std::unique_ptr<LlamaContext>> q8_ctx = LlamaContext::Create(model, qo);
  CodecConfig q8;
  q8.codec = "q8";
  CG_ASSIGN_OR_RETURN(const Encoder q8_encoder, Encoder::Create(q8));

  SensitivityReport rep;
  rep.steps = o.steps;
  rep.q8_source = q8_ctx.ok() ? "llama.cpp's q8_0 cache" : "the q8 codec (the model cannot run llama.cpp's q8_0 cache)";
  rep.kl.assign(sections, std::vector<double>(o.steps.size(), 0));
  uint64_t scored = 0;
  std::vector<std::vector<float>> exact, got;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const std::vector<int32_t>& w = windows[wi];
    if (w.size() < size_t{N} + M + 1) return Status::InvalidArgument("sensitivity: window too short");
    ctx->Clear();
    CG_RETURN_IF_ERROR(ctx->Eval(std::span<const int32_t>(w).first(N), 0));
    CG_ASSIGN_OR_RETURN(CapturedKV cap, ctx->Capture(0));
    if (d.rope.kind != RopeConfig::Kind::kNone && !PositionsFrom(cap.positions, 0))
      return Status::Internal("sensitivity: captured positions are not 0..N-1");
    // The exact KV goes through the same inject path as the quantized ones.
    CG_RETURN_IF_ERROR(ctx->Inject(0, cap.kv.view(), cap.positions));
    CG_RETURN_IF_ERROR(TeacherForcedLogProbs(*ctx, w, N, M, &exact));
    if (q8_ctx.ok()) {  // the 8-bit reference
      LlamaContext& q = **q8_ctx;
      q.Clear();
      CG_RETURN_IF_ERROR(q.Eval(std::span<const int32_t>(w).first(N), 0));
      CG_RETURN_IF_ERROR(TeacherForcedLogProbs(q, w, N, M, &got));
      rep.q8_kl += MeanKL(exact, got);
    } else {
      CG_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, q8_encoder.Encode(cap.kv.view()));
      CG_ASSIGN_OR_RETURN(const Decoder dec, Decoder::Open(bytes));
      CG_ASSIGN_OR_RETURN(const KVTensor coded, dec.Decode(cap.kv.dtype()));
      CG_RETURN_IF_ERROR(ctx->Inject(0, coded.view(), cap.positions));
      CG_RETURN_IF_ERROR(TeacherForcedLogProbs(*ctx, w, N, M, &got));
      rep.q8_kl += MeanKL(exact, got);
    }
    KVTensor work = cap.kv;
    for (uint32_t sec = 0; sec < sections; ++sec) {
      for (size_t si = 0; si < o.steps.size(); ++si) {
        CG_RETURN_IF_ERROR(CopyKV(cap.kv.view(), work.view()));
        CG_RETURN_IF_ERROR(
            QuantizeSection(d, lloyd, sec, static_cast<float>(o.steps[si]), cap.kv.view(), work.view()));
        CG_RETURN_IF_ERROR(ctx->Inject(0, work.view(), cap.positions));
        CG_RETURN_IF_ERROR(TeacherForcedLogProbs(*ctx, w, N, M, &got));
        rep.kl[sec][si] += MeanKL(exact, got);
      }
    }
    scored += M;
    if (o.progress) o.progress(fmt::format("sensitivity: window {}/{} done", wi + 1, windows.size()));
  }
  rep.q8_kl /= double(scored);
  rep.weights.resize(sections);
  for (uint32_t sec = 0; sec < sections; ++sec) {
    // The weights fit the high-rate steps (<= 1) when there are any: coarser
    // ones leave the KL ∝ step^2 regime (on docs6L V sections saturate by 8).
    const bool any_fine = std::any_of(o.steps.begin(), o.steps.end(), [](double s) { return s <= 1; });
    double log_sum = 0;
    size_t fitted = 0;
    for (size_t si = 0; si < o.steps.size(); ++si) {
      double& kl = rep.kl[sec][si];
      kl /= double(scored);
      if (any_fine && o.steps[si] > 1) continue;
      log_sum += std::log(std::max(kl, 1e-30) / (o.steps[si] * o.steps[si]));
      ++fitted;
    }
    rep.weights[sec] = static_cast<float>(std::clamp(std::exp(log_sum / double(fitted)), 1e-30, 1e30));
  }
  CG_RETURN_IF_ERROR(MeasureJoint(*ctx, windows, d, lloyd, o, &rep));
  return rep;
}

}  // namespace cachegen::engine
