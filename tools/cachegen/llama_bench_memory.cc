// cachegen bench-memory: what a fixed amount of memory holds.
//   engine_cache  the longest context whose KV fits a KV memory budget with
//                 each llama.cpp cache type (bytes per token measured from the
//                 engine's own sequence state), and that type's KL against the
//                 f16 cache (eval's llama-TYPE rows)
//   host_cache    contexts per GiB of a host-memory prompt cache: f16 (what
//                 llama-server's --cache-ram keeps) against cachegen at each
//                 level of llama-serve's default ladder, with their KL
//   workload      a replayed multi-user workload (documents x questions,
//                 Zipf-popular documents) against a host cache of that size,
//                 f16 or cachegen frames (the real WithMemoryTier holds frames
//                 of the measured sizes): hit rate, and mean TTFT from the
//                 measured costs of a prefill, a load and a question
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/codec.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/store.h"
#include "engine/llama/auto_profile.h"
#include "engine/llama/eval.h"
#include "engine/llama_state.h"

namespace cachegen::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kEngineTypes[] = {"f16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"};

struct BenchMemoryArgs {
  std::vector<std::string> models;  // empty: docs6L, else DefaultModelPath
  std::string text;
  bool llama_1b = false;
  uint32_t context = 768, continuation = 128, windows = 4, threads = 0;
  uint32_t context_1b = 1024;  // the random 1B model's contexts (its KL windows are short: it means nothing)
  std::string kv_budget = "1G", host_cache = "1G";
  uint32_t docs = 50, questions = 20, question_tokens = 16;
  double zipf = 1.0, workload_kl = 1e-3;
  bool json = false;
};

struct ModelSpec {
  std::string path, text;
  bool trained = true;  // false: random weights (quality numbers mean nothing; no profile)
  uint32_t context = 0;
};

double Ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// KV bytes a token takes in a cache of `type`: two tokens' sequence state
// less one token's, less the cell's 12 metadata bytes (the engine's own
// serialization of its cache rows).
Result<uint64_t> BytesPerToken(const std::shared_ptr<LlamaModel>& model, const std::string& type) {
  LlamaContextOptions o;
  o.n_ctx = 16;
  o.threads = 1;
  o.cache = {type, type};
  CG_ASSIGN_OR_RETURN(auto ctx, LlamaContext::Create(model, o));
  const int32_t toks[2] = {std::max(0, model->info().bos), std::max(0, model->info().bos)};
  CG_RETURN_IF_ERROR(ctx->Eval(std::span<const int32_t>(toks, 1), 0));
  CG_ASSIGN_OR_RETURN(auto one, ctx->StateBlob(0));
  CG_RETURN_IF_ERROR(ctx->Eval(std::span<const int32_t>(toks + 1, 1), 1));
  CG_ASSIGN_OR_RETURN(auto two, ctx->StateBlob(0));
  return two.size() - one.size() - 12;
}

// The measured costs of the workload's three operations on one document.
struct Costs {
  double prefill_ms = 0, question_ms = 0, f16_load_ms = 0, cachegen_load_ms = 0;
  uint64_t f16_bytes = 0, cachegen_bytes = 0;
};

Result<Costs> MeasureCosts(const std::shared_ptr<LlamaModel>& model, const std::vector<int32_t>& doc,
                           uint32_t question_tokens, const CodecConfig& codec, uint32_t level, uint32_t threads) {
  LlamaContextOptions o;
  o.n_ctx = static_cast<uint32_t>(doc.size()) + question_tokens + 8;
  o.threads = threads;
  CG_ASSIGN_OR_RETURN(auto ctx, LlamaContext::Create(model, o));
  const std::vector<int32_t> question(doc.begin(), doc.begin() + question_tokens);
  const auto n = static_cast<int32_t>(doc.size());
  Costs c;
  std::vector<double> prefill, ask, f16_load, cg_load;
  CG_ASSIGN_OR_RETURN(Encoder enc, Encoder::Create(codec));
  std::vector<uint8_t> container;
  const ProfileSet profiles(codec.profile);
  // Three runs for medians; one where a prefill takes seconds (the 1B model).
  for (int rep = 0; rep < 3 && !(rep == 1 && prefill[0] > 2000); ++rep) {
    ctx->Clear();
    auto t0 = Clock::now();
    CG_RETURN_IF_ERROR(ctx->Eval(doc, 0));
    prefill.push_back(Ms(t0));
    CG_ASSIGN_OR_RETURN(CapturedKV cap, ctx->Capture(0));
    t0 = Clock::now();
    CG_RETURN_IF_ERROR(ctx->Eval(question, n));
    ask.push_back(Ms(t0));
    const KVTensor f16 = cap.kv.Converted(DType::kF16);
    c.f16_bytes = f16.size_bytes();
    t0 = Clock::now();
    CG_RETURN_IF_ERROR(ctx->Inject(0, f16.view(), cap.positions));
    f16_load.push_back(Ms(t0));
    if (container.empty()) {
      CG_ASSIGN_OR_RETURN(container, enc.Encode(cap.kv.view()));
    }
    t0 = Clock::now();
    CG_ASSIGN_OR_RETURN(Decoder dec, Decoder::Open(container, &profiles));
    CG_ASSIGN_OR_RETURN(KVTensor out, dec.Decode(DType::kF16, level));
    CG_RETURN_IF_ERROR(ctx->Inject(0, out.view(), cap.positions));
    cg_load.push_back(Ms(t0));
    c.cachegen_bytes = 0;
    for (const ChunkEntry& e : dec.info().chunks) c.cachegen_bytes += e.frame_size[level];
  }
  c.prefill_ms = Median(prefill);
  c.question_ms = Median(ask);
  c.f16_load_ms = Median(f16_load);
  c.cachegen_load_ms = Median(cg_load);
  return c;
}

struct WorkloadResult {
  double hit_rate = 0, mean_ttft_ms = 0;
};

// Replays the requests against a host cache of `capacity` bytes holding one
// frame of `frame_bytes` per document: a hit costs a load, a miss a prefill
// (and the document's frame is kept); every request then asks its question.
WorkloadResult Replay(const std::vector<uint32_t>& requests, uint64_t capacity, uint64_t frame_bytes, double load_ms,
                      const Costs& c) {
  auto tier = WithMemoryTier(nullptr, capacity);
  const std::vector<uint8_t> frame(frame_bytes, 0);
  WorkloadResult r;
  double ttft = 0;
  uint64_t hits = 0;
  for (uint32_t doc : requests) {
    ChunkKey key{};
    std::memcpy(key.bytes.data(), &doc, sizeof doc);
    if (tier->Get(key, 0).ok()) {
      ++hits;
      ttft += load_ms;
    } else {
      ttft += c.prefill_ms;
      (void)tier->Put(key, 0, frame);  // a frame larger than the whole cache is not kept
    }
    ttft += c.question_ms;
  }
  r.hit_rate = requests.empty() ? 0 : static_cast<double>(hits) / requests.size();
  r.mean_ttft_ms = requests.empty() ? 0 : ttft / requests.size();
  return r;
}

// docs x questions requests, each for a document drawn with Zipf(s) popularity.
std::vector<uint32_t> Requests(uint32_t docs, uint32_t questions, double s) {
  std::vector<double> weight(docs);
  for (uint32_t d = 0; d < docs; ++d) weight[d] = 1.0 / std::pow(d + 1.0, s);
  std::discrete_distribution<uint32_t> pick(weight.begin(), weight.end());
  std::mt19937_64 rng(42);
  std::vector<uint32_t> out(size_t{docs} * questions);
  for (uint32_t& d : out) d = pick(rng);
  return out;
}

Status RunModel(const BenchMemoryArgs& a, const ModelSpec& m, nlohmann::json* out) {
  CG_ASSIGN_OR_RETURN(std::shared_ptr<LlamaModel> model, LlamaModel::Load(m.path));
  const LlamaModelInfo& info = model->info();
  const std::string name = std::filesystem::path(m.path).filename().string();
  auto say = [&](const std::string& line) {
    if (!a.json) std::fprintf(stderr, "bench-memory: %s: %s\n", name.c_str(), line.c_str());
  };
  CG_ASSIGN_OR_RETURN(const uint64_t kv_budget, ParseByteSize(a.kv_budget, "--kv-budget"));
  CG_ASSIGN_OR_RETURN(const uint64_t host_cache, ParseByteSize(a.host_cache, "--host-cache"));

  // Quality: one eval of the engine's cache types and cachegen's default ladder.
  engine::EvalOptions eo;
  eo.model_path = m.path;
  eo.text = m.text;
  eo.context = m.trained ? a.context : 128;
  eo.continuation = m.trained ? a.continuation : 32;
  eo.windows = m.trained ? a.windows : 1;
  eo.greedy = 0;
  eo.threads = a.threads;
  for (const char* t : kEngineTypes)
    if (std::string(t) != "f16") eo.codecs.push_back(std::string("llama-") + t);
  eo.codecs.push_back("cachegen");
  eo.levels = 4;  // llama-serve's ladder
  eo.codec.chunk_tokens = 256;
  if (m.trained) {
    say("the model's automatic profile");
    engine::AutoProfileOptions ao;
    ao.model_path = m.path;
    ao.model = model;
    ao.threads = a.threads;
    CG_ASSIGN_OR_RETURN(engine::AutoProfile p, engine::AutoModelProfile(ao));
    eo.codec.profile = p.profile;
    eo.codec.quantizer = p.profile->quantizer().value_or(eo.codec.quantizer);
    eo.max_kl = {engine::DefaultBestLevelKl(*p.profile)};
  } else {
    eo.bits = {4};  // no profile on random weights: a rate ladder from 4 bits/value
  }
  eo.progress = say;
  CG_ASSIGN_OR_RETURN(engine::EvalReport rep, engine::RunEval(eo));
  auto kl_of = [&](const std::string& codec) {
    for (const auto& r : rep.rows)
      if (r.codec == codec) return r.kl;
    return -1.0;
  };

  for (const char* t : kEngineTypes) {
    CG_ASSIGN_OR_RETURN(const uint64_t per_token, BytesPerToken(model, t));
    out->at("engine_cache").push_back({{"model", name},
                                       {"cache_type", t},
                                       {"bytes_per_token", per_token},
                                       {"max_context_tokens", kv_budget / per_token},
                                       {"kl", std::string(t) == "f16" ? 0.0 : kl_of(std::string("llama-") + t)}});
  }

  // Host cache: contexts of `context` tokens per GiB.
  const uint32_t context = m.context;
  const double values = double(context) * info.layers * 2 * info.kv_heads * info.head_dim;
  const double gib = double(1ull << 30);
  out->at("host_cache").push_back({{"model", name}, {"codec", "f16"}, {"level", 0}, {"bits_per_value", 16.0},
                                   {"kl", 0.0}, {"contexts_per_gib", gib / (values * 2)}});
  uint32_t workload_level = 0;
  double workload_bits = 0;
  for (const auto& r : rep.rows) {
    if (r.codec != "cachegen") continue;
    out->at("host_cache").push_back({{"model", name}, {"codec", "cachegen"}, {"level", r.level},
                                     {"setting", r.setting}, {"bits_per_value", r.bits_per_value}, {"kl", r.kl},
                                     {"contexts_per_gib", gib / (values * r.bits_per_value / 8)}});
    // The workload's tier holds the smallest level within the KL bound.
    if (r.kl <= a.workload_kl && (workload_bits == 0 || r.bits_per_value < workload_bits)) {
      workload_bits = r.bits_per_value;
      workload_level = r.level;
    }
  }
  if (workload_bits == 0) {
    say(fmt::format("no cachegen level within KL {:g}: the workload uses level 0", a.workload_kl));
  }

  // The workload: measured costs on the first document, replayed.
  const auto windows = engine::MakeWindows(*model, m.text, context, 1);
  if (windows.empty()) return Status::InvalidArgument(fmt::format("the text has no window of {} tokens", context));
  say(fmt::format("measuring prefill, question and loads on a context of {} tokens", context));
  CodecConfig codec = eo.codec;
  codec.levels = 4;
  codec.rope = CodecRope(info);  // as eval codes it
  if (!eo.max_kl.empty()) codec.max_kl = eo.max_kl[0];
  if (!eo.bits.empty()) codec.bits_per_value = eo.bits[0];
  CG_ASSIGN_OR_RETURN(Costs c, MeasureCosts(model, windows[0], a.question_tokens, codec, workload_level, a.threads));
  const std::vector<uint32_t> requests = Requests(a.docs, a.questions, a.zipf);
  const WorkloadResult f16 = Replay(requests, host_cache, c.f16_bytes, c.f16_load_ms, c);
  const WorkloadResult cg = Replay(requests, host_cache, c.cachegen_bytes, c.cachegen_load_ms, c);
  auto row = [&](const char* tier, uint64_t bytes, double load_ms, const WorkloadResult& w) {
    out->at("workload").push_back({{"model", name}, {"tier", tier}, {"level", std::string(tier) == "f16" ? 0 : workload_level},
                                   {"context_bytes", bytes}, {"load_ms", load_ms}, {"prefill_ms", c.prefill_ms},
                                   {"question_ms", c.question_ms}, {"hit_rate", w.hit_rate},
                                   {"mean_ttft_ms", w.mean_ttft_ms}});
  };
  row("f16", c.f16_bytes, c.f16_load_ms, f16);
  row("cachegen", c.cachegen_bytes, c.cachegen_load_ms, cg);
  return Status::Ok();
}

void PrintTables(const nlohmann::json& j) {
  std::printf("engine cache (KV budget %s)\n| model | cache type | bytes/token | max context tokens | KL vs f16 |\n"
              "|---|---|---|---|---|\n", j["kv_budget"].get<std::string>().c_str());
  for (const auto& r : j["engine_cache"])
    std::printf("| %s | %s | %llu | %llu | %.3g |\n", r["model"].get<std::string>().c_str(),
                r["cache_type"].get<std::string>().c_str(), (unsigned long long)r["bytes_per_token"].get<uint64_t>(),
                (unsigned long long)r["max_context_tokens"].get<uint64_t>(), r["kl"].get<double>());
  std::printf("\nhost cache\n| model | codec | level | bits/value | KL | contexts per GiB |\n|---|---|---|---|---|---|\n");
  for (const auto& r : j["host_cache"])
    std::printf("| %s | %s | %d | %.3f | %.3g | %.1f |\n", r["model"].get<std::string>().c_str(),
                r["codec"].get<std::string>().c_str(), r["level"].get<int>(), r["bits_per_value"].get<double>(),
                r["kl"].get<double>(), r["contexts_per_gib"].get<double>());
  std::printf("\nworkload (host cache %s, %s)\n| model | tier | level | MB/context | load ms | prefill ms | hit rate | "
              "mean TTFT ms |\n|---|---|---|---|---|---|---|---|\n",
              j["host_cache_size"].get<std::string>().c_str(), j["requests"].get<std::string>().c_str());
  for (const auto& r : j["workload"])
    std::printf("| %s | %s | %d | %.2f | %.1f | %.1f | %.3f | %.1f |\n", r["model"].get<std::string>().c_str(),
                r["tier"].get<std::string>().c_str(), r["level"].get<int>(), r["context_bytes"].get<uint64_t>() / 1e6,
                r["load_ms"].get<double>(), r["prefill_ms"].get<double>(), r["hit_rate"].get<double>(),
                r["mean_ttft_ms"].get<double>());
}

int RunBenchMemory(BenchMemoryArgs a) {
  std::vector<ModelSpec> specs;
  Result<std::string> text = TextOrDefault("bench-memory", a.text.empty() && std::filesystem::exists(kDocsText)
                                                                ? std::string(kDocsText) : a.text);
  if (!text.ok()) return Fail(text.status());
  if (a.models.empty()) {
    if (std::filesystem::exists(kDocsModel)) {
      a.models.push_back(kDocsModel);
    } else {
      Result<std::string> path = DefaultModelPath("bench-memory");
      if (!path.ok()) return Fail(path.status());
      a.models.push_back(*path);
    }
  }
  for (const std::string& m : a.models) specs.push_back({m, *text, true, a.context});
  if (a.llama_1b) {
    Result<std::string> path = RandomLlama1BPath("bench-memory");
    if (!path.ok()) return Fail(path.status());
    std::string long_text;
    while (long_text.size() < 8 * a.context_1b) long_text += *text;
    specs.push_back({*path, long_text, false, a.context_1b});
  }
  nlohmann::json j = {{"engine_cache", nlohmann::json::array()},
                      {"host_cache", nlohmann::json::array()},
                      {"workload", nlohmann::json::array()},
                      {"kv_budget", a.kv_budget},
                      {"host_cache_size", a.host_cache},
                      {"requests", fmt::format("{} documents x {} questions, Zipf s={:g}", a.docs, a.questions, a.zipf)}};
  for (const ModelSpec& m : specs) {
    if (Status st = RunModel(a, m, &j); !st.ok()) return Fail(st);
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    PrintTables(j);
  }
  return 0;
}

const bool kRegistered = RegisterCommand(50, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchMemoryArgs>();
  CLI::App* sub = root.add_subcommand(
      "bench-memory", "What a fixed memory holds: longest context per llama.cpp cache type, contexts per GiB of a "
                      "host cache (f16 or cachegen), and a replayed multi-user workload's hit rate and TTFT");
  sub->add_option("--model", a->models,
                  std::string("GGUF model(s) (default: ") + kDocsModel + ", else " + kSharedModel +
                      ", else a random-weight tiny model)");
  sub->add_option("--text", a->text, std::string("Text (default: ") + kDocsText + " where present)");
  sub->add_flag("--llama-1b", a->llama_1b,
                "Also the random-weight Llama-3.2-1B-shaped model (written once; its KL means nothing)");
  sub->add_option("--context", a->context, "Context tokens of a trained model's windows and cached contexts")
      ->capture_default_str();
  sub->add_option("--context-1b", a->context_1b, "Cached context tokens of the 1B model")->capture_default_str();
  sub->add_option("--continuation", a->continuation, "Tokens scored after each window")->capture_default_str();
  sub->add_option("--windows", a->windows, "Eval windows of a trained model")->capture_default_str();
  sub->add_option("--kv-budget", a->kv_budget, "Engine KV memory budget")->capture_default_str();
  sub->add_option("--host-cache", a->host_cache, "Host cache size for the workload")->capture_default_str();
  sub->add_option("--docs", a->docs, "Workload documents")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--questions", a->questions, "Questions per document (requests = docs x questions)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  sub->add_option("--question-tokens", a->question_tokens, "Tokens of a question")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_option("--zipf", a->zipf, "Zipf exponent of document popularity")->capture_default_str();
  sub->add_option("--workload-kl", a->workload_kl,
                  "The workload's cachegen tier holds the smallest level with at most this KL")
      ->capture_default_str();
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [sub, a] { return *sub ? std::optional<int>(RunBenchMemory(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
