// cachegen bench-repeat: does an answer change when its prompt comes back?
// Each long prompt is sent twice to llama-serve's engine (greedy, N tokens):
// the first request prefills it and stores its chunks, the second loads the
// cached prefix at the best level. Counted per stored-chunk coding: how often
// the second completion is identical to the first, and the bytes the second
// requests moved.
//   default  what llama-serve does without options: the model's automatic
//            profile, 4 levels, the best at engine::DefaultBestLevelKl
//   bits2    the codec's bits default without a profile (2 bits/value)
//   q8, fp16 block-32 8-bit and raw f16 chunks
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/store.h"
#include "engine/llama/auto_profile.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/eval.h"

namespace cachegen::cli {
namespace {

struct BenchRepeatArgs {
  std::string model, text, modes = "default,bits2,q8,fp16";
  uint32_t prompts = 20, prompt_tokens = 768, tokens = 32, threads = 0;
  std::vector<double> best_kl;  // "default" at these best-level KL targets instead of the default one
  bool json = false;
};

struct ModeResult {
  std::string mode, coding;
  uint32_t identical = 0, prompts = 0;
  uint64_t cached_tokens = 0, bytes = 0;
};

// The engine options of one mode; `coding` says what its chunks are.
Result<LlamaServeOptions> ModeOptions(const std::string& mode, double best_kl, const BenchRepeatArgs& a,
                                      std::string* coding) {
  LlamaServeOptions o;
  o.model_fingerprint = "bench-repeat";
  o.n_ctx = a.prompt_tokens + a.tokens + 64;
  o.threads = a.threads;
  o.codec.levels = 1;
  if (mode == "default") {
    CG_RETURN_IF_ERROR(UseServeDefaultCoding("bench-repeat", a.model, a.threads, best_kl, &o.codec, coding));
  } else if (mode == "bits2") {
    o.codec.levels = 4;
    *coding = "cachegen without a profile, 2 bits/value";
  } else if (mode == "q8" || mode == "fp16") {
    o.codec.codec = mode;
    *coding = mode;
  } else {
    return Status::InvalidArgument("unknown mode '" + mode + "' (default, bits2, q8, fp16)");
  }
  return o;
}

Result<ModeResult> RunMode(const std::string& mode, double best_kl, const BenchRepeatArgs& a,
                           const std::shared_ptr<LlamaModel>& model, const std::vector<std::vector<int32_t>>& prompts) {
  ModeResult r;
  r.mode = mode;
  CG_ASSIGN_OR_RETURN(LlamaServeOptions o, ModeOptions(mode, best_kl, a, &r.coding));
  CG_ASSIGN_OR_RETURN(std::unique_ptr<ChunkStore> store, OpenStore("mem://"));
  CG_ASSIGN_OR_RETURN(std::unique_ptr<LlamaCompletionEngine> engine,
                      LlamaCompletionEngine::Create(model, store.get(), o));
  for (const std::vector<int32_t>& p : prompts) {
    serve::CompletionRequest req;
    req.prompt_tokens = p;
    req.max_tokens = a.tokens;
    req.temperature = 0;
    const auto ignore = [](const std::string&) { return true; };
    CG_ASSIGN_OR_RETURN(serve::CompletionResult first, engine->Complete(0, req, ignore));
    engine->FlushStores();
    CG_ASSIGN_OR_RETURN(serve::CompletionResult second, engine->Complete(0, req, ignore));
    r.identical += first.text == second.text;
    r.cached_tokens += second.timings.cached_tokens;
    r.bytes += second.timings.transfer_bytes;
    ++r.prompts;
  }
  return r;
}

int RunBenchRepeat(BenchRepeatArgs a) {
  Result<ModelAndText> loaded = LoadModelAndText("bench-repeat", a.model, a.text);
  if (!loaded.ok()) return Fail(loaded.status());
  a.model = loaded->model_path;
  const std::shared_ptr<LlamaModel>& model = loaded->model;
  const std::string& text_source = loaded->text_source;
  const std::vector<std::vector<int32_t>> prompts = engine::MakeWindows(*model, loaded->text, a.prompt_tokens, a.prompts);
  if (prompts.empty())
    return Fail(Status::InvalidArgument(fmt::format("the text has no window of {} tokens", a.prompt_tokens)));
  const LlamaModelInfo& info = model->info();
  const double values_per_token = 2.0 * info.layers * info.kv_heads * info.head_dim;
  std::vector<ModeResult> results;
  for (const std::string& mode : SplitList(a.modes)) {
    std::vector<double> kls = {0};
    if (mode == "default" && !a.best_kl.empty()) kls = a.best_kl;
    for (double kl : kls) {
      Result<ModeResult> r = RunMode(mode, kl, a, model, prompts);
      if (!r.ok()) return Fail(r.status());
      results.push_back(std::move(*r));
    }
  }
  const ModeResult* q8 = nullptr;
  for (const ModeResult& r : results)
    if (r.mode == "q8") q8 = &r;
  auto bits = [&](const ModeResult& r) {
    return r.cached_tokens ? double(r.bytes) * 8 / (double(r.cached_tokens) * values_per_token) : 0.0;
  };
  if (a.json) {
    nlohmann::json j = {{"model", a.model},         {"text", text_source}, {"prompts", prompts.size()},
                        {"prompt_tokens", a.prompt_tokens}, {"tokens", a.tokens}, {"modes", nlohmann::json::array()}};
    for (const ModeResult& r : results)
      j["modes"].push_back({{"mode", r.mode},
                            {"coding", r.coding},
                            {"identical", r.identical},
                            {"prompts", r.prompts},
                            {"cached_tokens", r.cached_tokens},
                            {"bytes", r.bytes},
                            {"bits_per_value", bits(r)},
                            {"bytes_vs_q8", q8 && q8->bytes ? nlohmann::json(double(r.bytes) / double(q8->bytes))
                                                            : nlohmann::json(nullptr)}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %zu prompts of %u tokens (%s), each sent twice, %u greedy tokens\n", a.model.c_str(), prompts.size(),
              a.prompt_tokens, text_source.c_str(), a.tokens);
  std::printf("%-8s %10s %12s %9s %8s  %s\n", "mode", "identical", "bytes moved", "bits/val", "vs q8", "chunks");
  for (const ModeResult& r : results)
    std::printf("%-8s %6u/%-3u %12llu %9.3f %8s  %s\n", r.mode.c_str(), r.identical, r.prompts,
                static_cast<unsigned long long>(r.bytes), bits(r),
                q8 && q8->bytes ? fmt::format("{:.3f}x", double(r.bytes) / double(q8->bytes)).c_str() : "-",
                r.coding.c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(50, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchRepeatArgs>();
  CLI::App* sub = root.add_subcommand(
      "bench-repeat", "Send each long prompt twice to llama-serve's engine: how often the answer from cached KV is "
                      "identical, and the bytes moved, per chunk coding");
  sub->add_option("--model", a->model, std::string("GGUF model (default: ") + kSharedModel + ", else a random-weight tiny model)");
  sub->add_option("--text", a->text, std::string("Text of the prompts, documents separated by <|endoftext|> lines (default: ") +
                                         kSharedText + ")");
  sub->add_option("--modes", a->modes, "Chunk codings: default, bits2, q8, fp16")->capture_default_str();
  sub->add_option("--prompts", a->prompts, "Prompts (each at a document start)")->capture_default_str()->check(CLI::Range(1, 10000));
  sub->add_option("--prompt-tokens", a->prompt_tokens, "Tokens per prompt")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  sub->add_option("--tokens", a->tokens, "Greedy tokens per completion")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  sub->add_option("--best-kl", a->best_kl, "Run mode default at these best-level KL targets instead (comma list)")
      ->delimiter(',');
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [sub, a] { return *sub ? std::optional<int>(RunBenchRepeat(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
