// cachegen bench-prefill-store: does llama-serve's background store keep up
// with prefill at sustained load? Distinct long prompts are prefilled back
// to back on one slot, as fast as the engine evaluates them (the most one
// slot can ask of the store). After each prefill the engine queues the
// prompt's whole chunks for encoding at every level on its store thread (a
// queue of 4 prompts; when full the oldest is dropped and counted, as
// llama-serve does). Reported: the prefill rate, the drain time after the
// last prefill, the chunks stored, and the drop counter of /metrics.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/store.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/eval.h"

namespace cachegen::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchStoreArgs {
  std::string model, text, coding = "default";
  uint32_t prompts = 16, prompt_tokens = 1024, threads = 0;
  bool json = false;
};

struct StoreLoad {
  std::string coding;
  double prefill_s = 0;     // the prefills, back to back
  double drain_s = 0;       // after the last prefill until the queue was empty
  uint64_t stored_chunks = 0, stored_bytes = 0, dropped = 0, errors = 0;
};

// A counter of the engine's /metrics text.
uint64_t Metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + name.size() + 2));
}

Result<StoreLoad> Run(const BenchStoreArgs& a, const std::shared_ptr<LlamaModel>& model,
                      const std::vector<std::vector<int32_t>>& prompts) {
  LlamaServeOptions o;
  o.model_fingerprint = "bench-prefill-store";
  o.n_ctx = a.prompt_tokens + 8;
  o.threads = a.threads;
  StoreLoad r;
  if (a.coding == "default") {
    CG_RETURN_IF_ERROR(UseServeDefaultCoding("bench-prefill-store", a.model, a.threads, 0, &o.codec, &r.coding));
  } else if (a.coding == "bits2") {
    o.codec.levels = 4;
    r.coding = "cachegen without a profile, 2 bits/value, 4 levels";
  } else {
    return Status::InvalidArgument("unknown coding '" + a.coding + "' (default, bits2)");
  }
  CG_ASSIGN_OR_RETURN(std::unique_ptr<ChunkStore> store, OpenStore("mem://"));
  CG_ASSIGN_OR_RETURN(std::unique_ptr<LlamaCompletionEngine> engine,
                      LlamaCompletionEngine::Create(model, store.get(), o));
  const auto t0 = Clock::now();
  for (const std::vector<int32_t>& p : prompts) CG_RETURN_IF_ERROR(engine->Prefill(0, p, 0).status());
  const auto t1 = Clock::now();
  engine->FlushStores();
  const auto t2 = Clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.drain_s = std::chrono::duration<double>(t2 - t1).count();
  const std::string m = engine->MetricsText();
  r.stored_chunks = Metric(m, "cachegen_llama_stored_chunks_total");
  r.stored_bytes = Metric(m, "cachegen_llama_stored_bytes_total");
  r.dropped = Metric(m, "cachegen_llama_store_dropped_total");
  r.errors = Metric(m, "cachegen_llama_store_errors_total");
  return r;
}

int RunBenchStore(BenchStoreArgs a) {
  Result<ModelAndText> loaded = LoadModelAndText("bench-prefill-store", a.model, a.text);
  if (!loaded.ok()) return Fail(loaded.status());
  a.model = loaded->model_path;
  const std::vector<std::vector<int32_t>> prompts =
      engine::MakeWindows(*loaded->model, loaded->text, a.prompt_tokens, a.prompts);
  if (prompts.size() < a.prompts)
    return Fail(Status::InvalidArgument(fmt::format("the text has {} windows of {} tokens, not {}", prompts.size(),
                                                    a.prompt_tokens, a.prompts)));
  Result<StoreLoad> r = Run(a, loaded->model, prompts);
  if (!r.ok()) return Fail(r.status());
  const double tokens = double(a.prompts) * a.prompt_tokens;
  const uint64_t chunks_offered = uint64_t{a.prompts} * (a.prompt_tokens / 256);
  if (a.json) {
    std::printf("%s\n", nlohmann::json({{"model", a.model},
                                        {"text", loaded->text_source},
                                        {"coding", r->coding},
                                        {"prompts", a.prompts},
                                        {"prompt_tokens", a.prompt_tokens},
                                        {"prefill_tokens_per_s", tokens / r->prefill_s},
                                        {"drain_s", r->drain_s},
                                        {"store_tokens_per_s", tokens / (r->prefill_s + r->drain_s)},
                                        {"stored_chunks", r->stored_chunks},
                                        {"stored_bytes", r->stored_bytes},
                                        {"dropped_prompts", r->dropped},
                                        {"store_errors", r->errors},
                                        {"keeps_up", r->dropped == 0 && r->errors == 0}})
                                .dump(2)
                                .c_str());
    return 0;
  }
  std::printf("%s: %u distinct prompts of %u tokens prefilled back to back on one slot (%s)\n", a.model.c_str(),
              a.prompts, a.prompt_tokens, loaded->text_source.c_str());
  std::printf("coding: %s\n", r->coding.c_str());
  std::printf("prefill: %.2f s, %.0f tokens/s; the store drained %.2f s after the last prefill (%.0f tokens/s "
              "end to end)\n",
              r->prefill_s, tokens / r->prefill_s, r->drain_s, tokens / (r->prefill_s + r->drain_s));
  std::printf("stored: %llu of %llu chunks (%.1f MB); dropped prompts: %llu; store errors: %llu -> %s\n",
              static_cast<unsigned long long>(r->stored_chunks), static_cast<unsigned long long>(chunks_offered),
              r->stored_bytes / 1e6, static_cast<unsigned long long>(r->dropped),
              static_cast<unsigned long long>(r->errors),
              r->dropped == 0 && r->errors == 0 ? "keeps up" : "does not keep up");
  return 0;
}

const bool kRegistered = RegisterCommand(53, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchStoreArgs>();
  CLI::App* sub = root.add_subcommand(
      "bench-prefill-store", "Whether llama-serve's background store keeps up with back-to-back prefills (drops)");
  sub->add_option("--model", a->model, std::string("GGUF model (default: ") + kSharedModel + ")");
  sub->add_option("--text", a->text, std::string("Text the prompts are cut from (default: ") + kSharedText + ")");
  sub->add_option("--coding", a->coding,
                  "default: as llama-serve (the model's automatic profile, 4 levels); bits2: no profile, 2 bits/value, "
                  "4 levels")
      ->capture_default_str();
  sub->add_option("--prompts", a->prompts, "Distinct prompts")->capture_default_str()->check(CLI::Range(1u, 10000u));
  sub->add_option("--prompt-tokens", a->prompt_tokens, "Tokens per prompt (whole 256-token chunks are stored)")
      ->capture_default_str()
      ->check(CLI::Range(256u, 1u << 20));
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [sub, a] { return *sub ? std::optional<int>(RunBenchStore(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
