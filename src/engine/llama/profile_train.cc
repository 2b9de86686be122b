#include "engine/llama/profile_train.h"

#include <span>

#include "cachegen/llama_engine.h"
#include "codec/cachegen/profile_data.h"
#include "engine/llama/channel_weights.h"
#include "engine/llama/eval.h"

namespace cachegen::engine {
namespace {

void Say(const ModelProfileOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

// The attention-output grams channel weights need, or none (said why).
std::vector<std::vector<float>> WeightGrams(const ModelProfileOptions& o, const LlamaModelInfo& info, bool* use) {
  *use = o.channel_weights;
  if (!*use) return {};
  if (o.tuning.rotate) {
    Say(o, "profile: channel weights skipped (not with --rotate)");
    *use = false;
    return {};
  }
  auto grams = AttentionOutputGrams(o.model_path, info);
  if (grams.ok()) return std::move(*grams);
  Say(o, "profile: channel weights skipped: " + grams.status().ToString());
  *use = false;
  return {};
}

}  // namespace

Result<ModelProfile> TrainModelProfile(const ModelProfileOptions& o) {
  std::shared_ptr<LlamaModel> model = o.model;
  if (!model) {
    CG_ASSIGN_OR_RETURN(model, LlamaModel::Load(o.model_path));
  }
  const uint32_t length = o.context + o.continuation + 1;
  std::vector<std::vector<int32_t>> windows;
  if (o.windows.empty()) {
    windows = MakeWindows(*model, o.text, length, o.skip + o.contexts);
  } else {
    for (const auto& w : o.windows) {
      if (w.size() < length) return Status::InvalidArgument("a token window is shorter than context + continuation + 1");
      if (windows.size() < size_t{o.skip} + o.contexts) windows.push_back(w);
    }
  }
  if (windows.size() <= o.skip)
    return Status::InvalidArgument("the text has no window of " + std::to_string(o.context) + " tokens after the " +
                                   std::to_string(o.skip) + " skipped");
  CodecConfig cfg = o.tuning;
  cfg.rope = o.rope ? CodecRope(model->info()) : RopeConfig{};
  ModelProfile out;
  ChannelWeightAccumulator weights(model->info(), cfg.rope, WeightGrams(o, model->info(), &out.channel_weights));
  LlamaContextOptions co;
  co.n_ctx = o.context + 8;
  co.threads = o.threads;
  co.cache = o.cache;
  co.model_basis = true;
  if (out.channel_weights)
    co.query_observer = [&weights](uint32_t layer, int32_t pos0, std::span<const float> q) {
      weights.ObserveQueries(layer, pos0, q);
    };
  CG_ASSIGN_OR_RETURN(std::unique_ptr<LlamaContext> ctx, LlamaContext::Create(model, co));
  std::vector<KVTensor> kvs;
  for (size_t w = o.skip; w < windows.size(); ++w) {
    ctx->Clear();
    CG_RETURN_IF_ERROR(ctx->Eval(std::span<const int32_t>(windows[w]).first(o.context), 0));
    CG_ASSIGN_OR_RETURN(CapturedKV cap, ctx->Capture(0));
    if (out.channel_weights) {
      // A graph without llama's query names (other architectures) reports no queries.
      if (Status st = weights.AddWindow(cap.kv.view()); !st.ok()) {
        Say(o, "profile: channel weights skipped: " + st.ToString());
        out.channel_weights = false;
      }
    }
    kvs.push_back(std::move(cap.kv));
  }
  std::vector<KVView> views;
  for (const KVTensor& t : kvs) views.push_back(t.view());
  out.contexts = static_cast<uint32_t>(views.size());
  // K sections only: V weights measured no gain on stories260K (docs/results/eval.md).
  ProfileTrainOptions train;
  train.key_transform = o.key_transform;
  train.key_channel_classes = o.channel_classes;
  const bool wide_heads = model->info().head_dim >= kValueCodingMinHeadDim;
  train.value_transform = o.value_transform.value_or(wide_heads);
  const bool value_weights = o.value_channel_weights.value_or(wide_heads);
  train.value_channel_classes = o.value_channel_classes;
  train.channel_weight_strength = o.channel_weight_strength;
  if (out.channel_weights) train.channel_weights = weights.weights();
  for (size_t i = 1; !value_weights && i < train.channel_weights.size(); i += 2)
    train.channel_weights[i].clear();
  if (o.key_transform && cfg.rotate) Say(o, "profile: key transforms skipped (not with --rotate)");
  CG_ASSIGN_OR_RETURN(out.profile, Profile::Train(views, cfg, train));
  if (!o.sensitivity) return out;
  SensitivityOptions so;
  so.context = o.context;
  so.continuation = o.continuation;
  so.steps = o.sensitivity_steps;
  so.threads = o.threads;
  so.cache = o.cache;
  so.progress = o.progress;
  CG_ASSIGN_OR_RETURN(out.sensitivity,
                      MeasureSensitivity(model, std::span(windows).subspan(o.skip), *out.profile, cfg, so));
  SensitivityCurve curve;
  if (out.sensitivity->steps.size() >= 2) {  // a curve needs two points
    curve.steps.assign(out.sensitivity->steps.begin(), out.sensitivity->steps.end());
    for (const std::vector<double>& row : out.sensitivity->kl) curve.kl.insert(curve.kl.end(), row.begin(), row.end());
    curve.q8_kl = static_cast<float>(out.sensitivity->q8_kl);
  }
  CG_ASSIGN_OR_RETURN(out.profile, out.profile->WithSensitivity(out.sensitivity->weights, curve));
  // The joint calibration: what the curves predict at each joint multiplier
  // against what was measured there.
  const SensitivityReport& rep = *out.sensitivity;
  if (!curve.steps.empty() && !rep.joint_multipliers.empty()) {
    const internal::ProfileData& d = out.profile->data();
    const std::vector<float> f = internal::ProfileData::StepFactors(rep.weights);
    for (size_t j = 0; j < rep.joint_multipliers.size(); ++j) {
      double sum = 0;
      for (uint32_t sec = 0; sec < f.size(); ++sec) sum += d.SectionKl(sec, rep.joint_multipliers[j] * f[sec]);
      // Points that say nothing (no change, or not beyond the previous prediction) are left out.
      const float p = static_cast<float>(sum), m = static_cast<float>(rep.joint_kl[j]);
      if (!(p > 0 && m > 0) || (!curve.joint_predicted.empty() && !(p > curve.joint_predicted.back()))) continue;
      curve.joint_predicted.push_back(p);
      curve.joint_measured.push_back(m);
    }
    CG_ASSIGN_OR_RETURN(out.profile, out.profile->WithSensitivity(rep.weights, curve));
  }
  return out;
}

}  // namespace cachegen::engine
