// `cachegen profile train`: learns a model profile (.cgprof; include/cachegen/profile.h)
// from a few contexts of a llama.cpp model's own KV cache.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "engine/llama/profile_train.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

struct ProfileArgs {
  std::string text, output;
  engine::ModelProfileOptions train;  // its text is read from `text`
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
  std::printf("8-bit reference, %s: mean KL %.3e\n", r.q8_source.c_str(), r.q8_kl);
}

int RunTrain(const ProfileArgs& a) {
  Result<std::vector<uint8_t>> text = ReadFileBytes(a.text);
  if (!text.ok()) return Fail(text.status());
  engine::ModelProfileOptions o = a.train;
  o.text.assign(text->begin(), text->end());
  o.progress = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };
  Result<engine::ModelProfile> trained = engine::TrainModelProfile(o);
  if (!trained.ok()) return Fail(trained.status());
  const Profile& prof = *trained->profile;
  if (trained->sensitivity) PrintSensitivity(*trained->sensitivity);
  Status st = WriteFileBytes(a.output, prof.bytes());
  if (!st.ok()) return Fail(st);
  std::printf("%s: profile %016llx, %zu bytes, %u contexts x %u tokens, RoPE %s, key transforms %s, "
              "sensitivities %s, key channel weights %s, key tables per %s, value transforms %s, for the %s quantizer\n",
              a.output.c_str(), static_cast<unsigned long long>(prof.id()), prof.bytes().size(),
              trained->contexts, o.context, o.rope ? "undone" : "off", prof.data().HasTransform(0) ? "learned" : "none",
              trained->sensitivity ? "measured" : "none", trained->channel_weights ? "from attention" : "none",
              prof.data().HasClasses(0) ? "channel class" : "head", prof.data().HasTransform(1) ? "learned" : "none",
              o.tuning.quantizer == CodecConfig::Quantizer::kLloyd ? "lloyd" : "uniform");
  return 0;
}

const bool kRegistered = RegisterCommand(55, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* prof = root.add_subcommand("profile", "Model profiles: side information learned offline (.cgprof)");
  prof->require_subcommand(1);
  CLI::App* t = prof->add_subcommand(
      "train", "Learn channel statistics and entropy tables from a few contexts of a model's own KV cache");
  t->add_option("--model", a->train.model_path, "GGUF model")->required();
  t->add_option("--text", a->text, "Text, stories separated by <|endoftext|> lines")->required();
  t->add_option("-o,--output", a->output, "Output .cgprof")->required();
  t->add_option("--contexts", a->train.contexts, "Contexts (text windows) to learn from")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  t->add_option("--context-tokens", a->train.context, "Tokens per context")->capture_default_str();
  t->add_option("--continuation", a->train.continuation,
                 "Scored tokens after each context (sensitivity; windows are cut as eval cuts them)")
      ->capture_default_str();
  t->add_option("--skip-windows", a->train.skip, "Windows of the text to skip first (e.g. those an eval scores)")
      ->capture_default_str();
  t->add_flag("--sensitivity,!--no-sensitivity", a->train.sensitivity,
              "Measure each section's effect on the model's output (KL per squared step) and store it: rate "
              "control then allocates steps by it (default on)")
      ->capture_default_str();
  t->add_option("--sensitivity-steps", a->train.sensitivity_steps,
                "Section steps (units of channel scale) the sensitivity is measured at (rising, at most 16): "
                "those <= 1 fit the rate-control weights, all of them the curve that predicts KL (--max-kl)")
      ->delimiter(',')
      ->capture_default_str();
  t->add_flag("--channel-weights,!--no-channel-weights", a->train.channel_weights,
              "Weigh key channels by their first-order effect on the attention output (the model's queries, "
              "attention weights, values and output matrix): within each head, K channel scales move "
              "towards 1/sqrt(weight) (in log; the whole way with key transforms, half-way without) (default on)")
      ->capture_default_str();
  t->add_flag("--key-transform,!--no-key-transform", a->train.key_transform,
              "Learn a per-head decorrelating transform of the keys (KLT; frames code keys in that basis) (default on)")
      ->capture_default_str();
  t->add_option("--channel-weight-strength", a->train.channel_weight_strength,
                "How far channel scales move towards 1/sqrt(weight), in (0, 1] (0: the whole way with a transform, "
                "half-way without)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_flag_function(
      "--value-transform,!--no-value-transform", [a](int64_t n) { a->train.value_transform = n > 0; },
      "Learn a per-head transform of the values too (KLT; default: for heads of at least 32 dims)");
  t->add_flag("--value-channel-classes", a->train.value_channel_classes,
              "Also code V sections with one table per class of alike channels");
  t->add_flag_function(
      "--value-channel-weights,!--no-value-channel-weights", [a](int64_t n) { a->train.value_channel_weights = n > 0; },
      "Weigh V channel scales by the model's attention and output matrix too (default: for heads of at least 32 dims)");
  t->add_flag("--channel-classes,!--no-channel-classes", a->train.channel_classes,
              "Code K sections with one entropy table per class of alike channels instead of one per head "
              "(profile format version 4) (default on)")
      ->capture_default_str();
  t->add_option("--threads", a->train.threads, "llama.cpp threads (0: its default)")->capture_default_str();
  t->add_flag("--rope,!--no-rope", a->train.rope, "Learn keys with the model's RoPE undone (as the codec codes them) (default on)")
      ->capture_default_str();
  t->add_option("--group-tokens", a->train.tuning.group_tokens, "Prediction group size G of the delta tables (0 = default)");
  t->add_flag("--rotate,!--no-rotate", a->train.tuning.rotate, "Learn in the Hadamard-rotated domain (default off)");
  // Profiles default to the learned quantizer: at equal ΔPPL it takes ~10 %
  // fewer bits on stories260K (docs/results/eval.md), for ~2-3x encode time.
  a->train.tuning.quantizer = CodecConfig::Quantizer::kLloyd;
  AddQuantizerOption(t, &a->train.tuning);
  return [prof, t, a]() -> std::optional<int> {
    if (!*prof) return std::nullopt;
    if (*t) return RunTrain(*a);
    return 2;
  };
});

}  // namespace
}  // namespace cachegen::cli
