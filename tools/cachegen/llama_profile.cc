// `cachegen profile train`: learns a model profile (.cgprof; include/cachegen/profile.h)
// from a few contexts of a llama.cpp model's own KV cache.
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_engine.h"
#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "engine/llama/eval.h"
#include "engine/llama/channel_weights.h"
#include "engine/llama/sensitivity.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

struct ProfileArgs {
  std::string model, text, output;
  uint32_t contexts = 8, context = 384, continuation = 128, skip = 0, threads = 0;
  bool rope = true, sensitivity = true, channel_weights = true, key_transform = true, channel_classes = true;
  std::vector<double> steps = engine::SensitivityOptions().steps;
  CodecConfig tuning;
};

void PrintSensitivity(const engine::SensitivityReport& r) {
  std::printf("section  mean KL at step");
  for (double s : r.steps) std::printf(" %9g", s);
  std::printf("   weight (KL/step^2)  step factor\n");
  const std::vector<float> f = internal::ProfileData::StepFactors(r.weights);
  for (size_t i = 0; i < r.kl.size(); ++i) {
    std::printf("L%zu %s            ", i / 2, i % 2 ? "V" : "K");
    for (double kl : r.kl[i]) std::printf(" %9.2e", kl);
    std::printf("   %18.3e  %11.3f\n", r.weights[i], f[i]);
  }
}

int RunTrain(const ProfileArgs& a) {
  Result<std::vector<uint8_t>> text = ReadFileBytes(a.text);
  if (!text.ok()) return Fail(text.status());
  auto model = LlamaModel::Load(a.model);
  if (!model.ok()) return Fail(model.status());
  // Windows as `cachegen eval` cuts them (context + continuation + 1 tokens),
  // so that --skip-windows W skips exactly the text an eval of W windows scores.
  const auto windows = engine::MakeWindows(**model, std::string(text->begin(), text->end()),
                                           a.context + a.continuation + 1, a.skip + a.contexts);
  if (windows.size() <= a.skip)
    return Fail(Status::InvalidArgument("the text has no window of " + std::to_string(a.context) +
                                        " tokens after the " + std::to_string(a.skip) + " skipped"));
  CodecConfig cfg = a.tuning;
  cfg.rope = a.rope ? CodecRope((*model)->info()) : RopeConfig{};
  // Channel weights need the attention output matrix from the GGUF and no
  // rotation; without either the profile is trained without them, saying so.
  bool use_weights = a.channel_weights;
  std::vector<std::vector<float>> grams;
  if (use_weights && cfg.rotate) {
    std::fprintf(stderr, "profile: channel weights skipped (not with --rotate)\n");
    use_weights = false;
  } else if (use_weights) {
    auto g = engine::AttentionOutputGrams(a.model, (*model)->info());
    if (g.ok()) {
      grams = std::move(*g);
    } else {
      std::fprintf(stderr, "profile: channel weights skipped: %s\n", g.status().ToString().c_str());
      use_weights = false;
    }
  }
  engine::ChannelWeightAccumulator weights((*model)->info(), cfg.rope, std::move(grams));
  LlamaContextOptions co;
  co.n_ctx = a.context + 8;
  co.threads = a.threads;
  if (use_weights)
    co.query_observer = [&weights](uint32_t layer, int32_t pos0, std::span<const float> q) {
      weights.ObserveQueries(layer, pos0, q);
    };
  auto ctx = LlamaContext::Create(*model, co);
  if (!ctx.ok()) return Fail(ctx.status());
  std::vector<KVTensor> kvs;
  for (size_t w = a.skip; w < windows.size(); ++w) {
    (*ctx)->Clear();
    Status st = (*ctx)->Eval(std::span<const int32_t>(windows[w]).first(a.context), 0);
    if (!st.ok()) return Fail(st);
    auto cap = (*ctx)->Capture(0);
    if (!cap.ok()) return Fail(cap.status());
    if (use_weights) {
      // A graph without llama's query names (other architectures) reports no queries.
      st = weights.AddWindow(cap->kv.view());
      if (!st.ok()) {
        std::fprintf(stderr, "profile: channel weights skipped: %s\n", st.ToString().c_str());
        use_weights = false;
      }
    }
    kvs.push_back(std::move(cap->kv));
  }
  std::vector<KVView> views;
  for (const KVTensor& t : kvs) views.push_back(t.view());
  // K sections only: V weights measured no gain on stories260K (docs/EVAL.md).
  ProfileTrainOptions train;
  train.key_transform = a.key_transform;
  train.key_channel_classes = a.channel_classes;
  if (use_weights) train.channel_weights = weights.weights();
  for (size_t i = 1; i < train.channel_weights.size(); i += 2) train.channel_weights[i].clear();
  if (a.key_transform && cfg.rotate) std::fprintf(stderr, "profile: key transforms skipped (not with --rotate)\n");
  auto prof = Profile::Train(views, cfg, train);
  if (!prof.ok()) return Fail(prof.status());
  if (a.sensitivity) {
    engine::SensitivityOptions so;
    so.context = a.context;
    so.continuation = a.continuation;
    so.steps = a.steps;
    so.threads = a.threads;
    so.progress = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };
    auto rep = engine::MeasureSensitivity(*model, std::span(windows).subspan(a.skip), **prof, cfg, so);
    if (!rep.ok()) return Fail(rep.status());
    PrintSensitivity(*rep);
    prof = (*prof)->WithSensitivity(rep->weights);
    if (!prof.ok()) return Fail(prof.status());
  }
  Status st = WriteFileBytes(a.output, (*prof)->bytes());
  if (!st.ok()) return Fail(st);
  std::printf("%s: profile %016llx, %zu bytes, %zu contexts x %u tokens, RoPE %s, key transforms %s, "
              "sensitivities %s, key channel weights %s, key tables per %s, for the %s quantizer\n",
              a.output.c_str(), static_cast<unsigned long long>((*prof)->id()), (*prof)->bytes().size(),
              views.size(), a.context, cfg.rope.kind == RopeConfig::Kind::kNone ? "off" : "undone",
              (*prof)->data().HasTransform(0) ? "learned" : "none", a.sensitivity ? "measured" : "none",
              use_weights ? "from attention" : "none", (*prof)->data().HasClasses(0) ? "channel class" : "head",
              cfg.quantizer == CodecConfig::Quantizer::kLloyd ? "lloyd" : "uniform");
  return 0;
}

const bool kRegistered = RegisterCommand(55, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* prof = root.add_subcommand("profile", "Model profiles: side information learned offline (.cgprof)");
  prof->require_subcommand(1);
  CLI::App* t = prof->add_subcommand(
      "train", "Learn channel statistics and entropy tables from a few contexts of a model's own KV cache");
  t->add_option("--model", a->model, "GGUF model")->required();
  t->add_option("--text", a->text, "Text, stories separated by <|endoftext|> lines")->required();
  t->add_option("-o,--output", a->output, "Output .cgprof")->required();
  t->add_option("--contexts", a->contexts, "Contexts (text windows) to learn from")->capture_default_str();
  t->add_option("--context-tokens", a->context, "Tokens per context")->capture_default_str();
  t->add_option("--continuation", a->continuation,
                 "Scored tokens after each context (sensitivity; windows are cut as eval cuts them)")
      ->capture_default_str();
  t->add_option("--skip-windows", a->skip, "Windows of the text to skip first (e.g. those an eval scores)")
      ->capture_default_str();
  t->add_flag("--sensitivity,!--no-sensitivity", a->sensitivity,
              "Measure each section's effect on the model's output (KL per squared step) and store it: rate "
              "control then allocates steps by it")
      ->capture_default_str();
  t->add_option("--sensitivity-steps", a->steps, "Section steps (units of channel scale) the sensitivity is measured at")
      ->delimiter(',')
      ->capture_default_str();
  t->add_flag("--channel-weights,!--no-channel-weights", a->channel_weights,
              "Weigh key channels by their first-order effect on the attention output (the model's queries, "
              "attention weights, values and output matrix): within each head, K channel scales move "
              "towards 1/sqrt(weight) (in log; the whole way with key transforms, half-way without)")
      ->capture_default_str();
  t->add_flag("--key-transform,!--no-key-transform", a->key_transform,
              "Learn a per-head decorrelating transform of the keys (KLT; frames code keys in that basis)")
      ->capture_default_str();
  t->add_flag("--channel-classes,!--no-channel-classes", a->channel_classes,
              "Code K sections with one entropy table per class of alike channels instead of one per head "
              "(profile format version 4)")
      ->capture_default_str();
  t->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  t->add_flag("--rope,!--no-rope", a->rope, "Learn keys with the model's RoPE undone (as the codec codes them)")
      ->capture_default_str();
  t->add_option("--group-tokens", a->tuning.group_tokens, "Prediction group size G of the delta tables (0 = default)");
  t->add_flag("--rotate,!--no-rotate", a->tuning.rotate, "Learn in the Hadamard-rotated domain");
  // Profiles default to the learned quantizer: at equal ΔPPL it takes ~10 %
  // fewer bits on stories260K (docs/EVAL.md), for ~2-3x encode time.
  a->tuning.quantizer = CodecConfig::Quantizer::kLloyd;
  AddQuantizerOption(t, &a->tuning);
  return [prof, t, a]() -> std::optional<int> {
    if (!*prof) return std::nullopt;
    if (*t) return RunTrain(*a);
    return 2;
  };
});

}  // namespace
}  // namespace cachegen::cli
