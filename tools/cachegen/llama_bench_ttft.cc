// cachegen bench-ttft: time to first token of a long, reused context, loaded
// five ways over an emulated link, all in one run:
//   prefill   no cache: the engine prefills the whole prompt
//   f16       the raw f16 KV from the store (what llama.cpp's slot restore moves)
//   q8        block-32 8-bit KV
//   cachegen  the cachegen codec at its default rate, always the best level
//   adaptive  cachegen with 4 levels under a TTFT target: levels picked per chunk
// The link is the chunk service's rate limit (a real HTTP service on
// loopback). TTFT = the Prefill call: lookup + transfer (decode and the
// chunk-by-chunk injection overlap it) + evaluation of the uncached tail
// (here the one new token), whose logits give the first token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/service.h"
#include "cachegen/store.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/eval.h"
#include "engine/llama/random_model.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchTtftArgs {
  std::string model, text, weights = "f16";
  std::string contexts = "1024,2048,4096";
  std::string links = "0.1gbit,1gbit,10gbit";
  std::string modes = "prefill,f16,q8,cachegen,adaptive";
  uint32_t reps = 3, prefill_reps = 1, warmup = 1, chunk_tokens = 256, threads = 0, threads_batch = 0;
  double ttft_target_ms = 0;  // adaptive: 0 = derived per link from the cachegen mode (see kRegistered)
  // Quality of what the modes load, by a trained model (default kSharedModel
  // when present; "none": no quality table).
  std::string quality_model, quality_text;
  uint32_t quality_windows = 8;
  bool json = false;
};

// Real text for the prompt (repeated to length) when the shared data is
// there; otherwise a fixed pseudo-random token sequence.
std::vector<int32_t> PromptOf(const LlamaModel& model, const std::string& text_path, uint32_t n) {
  std::vector<int32_t> base;
  if (!text_path.empty()) {
    Result<std::vector<uint8_t>> bytes = ReadFileBytes(text_path);
    if (bytes.ok()) {
      Result<std::vector<int32_t>> t = model.Tokenize(std::string(bytes->begin(), bytes->end()));
      if (t.ok()) base = std::move(*t);
    }
  }
  std::vector<int32_t> out(n);
  for (uint32_t i = 0; i < n; ++i)
    out[i] = base.empty() ? static_cast<int32_t>((i * 7919u + 17u) % model.info().vocab) : base[i % base.size()];
  return out;
}

struct ModeSpec {
  std::string name, codec;
  uint32_t levels;
  bool adaptive;
};

Result<ModeSpec> Mode(const std::string& name) {
  if (name == "prefill") return ModeSpec{name, "", 0, false};
  if (name == "f16") return ModeSpec{name, "fp16", 1, false};
  if (name == "q8") return ModeSpec{name, "q8", 1, false};
  if (name == "cachegen") return ModeSpec{name, "cachegen", 4, false};
  if (name == "adaptive") return ModeSpec{name, "cachegen", 4, true};
  return Status::InvalidArgument("unknown mode '" + name + "' (prefill, f16, q8, cachegen, adaptive)");
}

struct Row {
  uint32_t tokens = 0;
  std::string link, mode;
  double ttft_ms = 0, lookup_ms = 0, transfer_ms = 0, decode_ms = 0, inject_ms = 0, prefill_ms = 0;
  double target_ms = 0;  // adaptive: the TTFT target it ran under
  uint64_t bytes = 0;
  double mean_level = 0;
  uint32_t cached_tokens = 0;
  double target_met = 1;  // share of the runs within the target
  uint32_t runs = 0;
};

// The timed runs of one mode on one link.
struct Samples {
  std::vector<double> ttft, lookup, transfer, decode, inject, prefill, levels;
  uint64_t bytes = 0;
  uint32_t cached = 0, met = 0;

  void Add(double ms, const serve::Timings& t, double target_ms) {
    ttft.push_back(ms);
    lookup.push_back(t.lookup_ms);
    transfer.push_back(t.transfer_ms);
    decode.push_back(t.decode_ms);
    inject.push_back(t.inject_ms);
    prefill.push_back(t.prefill_ms);
    double lsum = 0;
    for (uint32_t l : t.levels) lsum += l;
    levels.push_back(t.levels.empty() ? 0 : lsum / t.levels.size());
    bytes = t.transfer_bytes;
    cached = t.cached_tokens;
    if (target_ms <= 0 || ms <= target_ms) ++met;
  }
  Row ToRow(uint32_t n, const std::string& link, const std::string& mode, double target_ms) const {
    Row r;
    r.tokens = n;
    r.link = link;
    r.mode = mode;
    r.ttft_ms = Median(ttft);
    r.lookup_ms = Median(lookup);
    r.transfer_ms = Median(transfer);
    r.decode_ms = Median(decode);
    r.inject_ms = Median(inject);
    r.prefill_ms = Median(prefill);
    r.target_ms = target_ms;
    r.bytes = bytes;
    r.mean_level = Median(levels);
    r.cached_tokens = cached;
    r.runs = static_cast<uint32_t>(ttft.size());
    r.target_met = ttft.empty() ? 0 : static_cast<double>(met) / ttft.size();
    return r;
  }
};

// One engine per mode (its codec roots its own key chain) over `store`.
Result<std::unique_ptr<LlamaCompletionEngine>> MakeEngine(const std::shared_ptr<LlamaModel>& model,
                                                          ChunkStore* store, const ModeSpec& m, uint32_t n_ctx,
                                                          const BenchTtftArgs& a, double tokens_per_s,
                                                          double token_eval_ms) {
  LlamaServeOptions o;
  o.n_ctx = n_ctx;
  o.threads = a.threads;
  o.threads_batch = a.threads_batch;
  o.model_fingerprint = "bench-ttft";
  o.codec.codec = m.codec.empty() ? "fp16" : m.codec;
  o.codec.levels = m.levels ? m.levels : 1;
  o.codec.chunk_tokens = a.chunk_tokens;
  o.fixed_level = m.adaptive ? -1 : 0;
  o.recompute_tokens_per_s = tokens_per_s;
  o.token_eval_ms = token_eval_ms;
  o.store_new_chunks = false;  // the stores are filled once, from the prefill's KV
  return LlamaCompletionEngine::Create(model, m.codec.empty() ? nullptr : store, o);
}

Result<std::shared_ptr<LlamaModel>> LoadBenchModel(std::string* path, const std::string& weights) {
  if (path->empty()) {
    CG_ASSIGN_OR_RETURN(*path, RandomLlama1BPath("bench-ttft", weights));
  }
  return LlamaModel::Load(*path);
}

// One mode on one link: its engine over the shaped service.
struct ModeRun {
  const ModeSpec* mode = nullptr;
  std::shared_ptr<LinkShaper> link;
  std::unique_ptr<Service> service;
  std::unique_ptr<ChunkStore> remote;
  std::unique_ptr<LlamaCompletionEngine> engine;
  Samples samples;
  double target_ms = 0;
};

// The timing model's weights are random, so its outputs say nothing about
// what a codec costs in quality: a trained model judges the modes' codec
// settings instead (eval harness windows; keys RoPE-undone as llama-serve
// codes them; cachegen at every stored level, since the adaptive mode mixes
// them). Empty report when there is no trained model.
Result<std::optional<engine::EvalReport>> MeasureQuality(const BenchTtftArgs& a, const std::vector<ModeSpec>& modes) {
  std::string model = a.quality_model;
  if (model == "none") return std::optional<engine::EvalReport>();
  if (model.empty() && !std::filesystem::exists(kSharedModel)) {
    std::fprintf(stderr, "bench-ttft: no --quality-model and no %s: no quality table\n", kSharedModel);
    return std::optional<engine::EvalReport>();
  }
  if (model.empty()) model = kSharedModel;
  Result<std::string> text = TextOrDefault("bench-ttft", a.quality_text);
  if (!text.ok()) return text.status();
  engine::EvalOptions o;
  o.model_path = model;
  o.text = std::move(*text);
  o.windows = a.quality_windows;
  o.threads = a.threads_batch ? a.threads_batch : a.threads;
  o.codec.chunk_tokens = a.chunk_tokens;
  o.bits = {kDefaultBitsPerValue};
  for (const ModeSpec& m : modes) {
    if (m.codec.empty() || std::find(o.codecs.begin(), o.codecs.end(), m.codec) != o.codecs.end()) continue;
    o.codecs.push_back(m.codec);
    if (m.codec == "cachegen") o.levels = m.levels;
  }
  if (o.codecs.empty()) return std::optional<engine::EvalReport>();
  std::fprintf(stderr, "bench-ttft: quality of %s on %s\n", a.modes.c_str(), model.c_str());
  Result<engine::EvalReport> rep = engine::RunEval(o);
  if (!rep.ok()) return rep.status();
  return std::optional<engine::EvalReport>(std::move(*rep));
}

// Which modes load a quality row's data.
std::string LoadedBy(const engine::EvalRow& r) {
  if (r.codec == "fp16") return "f16";
  if (r.codec != "cachegen") return r.codec;
  return r.level == 0 ? "cachegen,adaptive" : "adaptive";
}

// Prints the quality table (unless json) and returns it as JSON (null without one).
nlohmann::json QualityTable(const std::optional<engine::EvalReport>& q, bool json) {
  if (!q) return nullptr;
  nlohmann::json rows = nlohmann::json::array();
  if (!json)
    std::printf("\nquality by %s (trained model): %u windows of %u context + %u scored tokens, exact PPL %.4f\n"
                "%-18s %-22s %6s %10s %8s %10s %6s %7s\n",
                std::filesystem::path(q->model).filename().c_str(), q->windows, q->context, q->continuation,
                q->ppl_exact, "loaded_by", "setting", "level", "bits/value", "dPPL%", "KL", "top1", "greedy");
  for (const engine::EvalRow& r : q->rows) {
    if (json)
      rows.push_back({{"loaded_by", LoadedBy(r)}, {"codec", r.codec}, {"setting", r.setting}, {"level", r.level},
                      {"bits_per_value", r.bits_per_value}, {"ratio_vs_fp16", r.ratio_vs_fp16},
                      {"delta_ppl_pct", r.delta_ppl_pct}, {"kl", r.kl}, {"top1_agreement", r.top1_agreement},
                      {"greedy_match", r.greedy_match}});
    else
      std::printf("%-18s %-22s %6u %10.3f %8.2f %10.2e %6.3f %7.3f\n", LoadedBy(r).c_str(),
                  (r.codec + " " + r.setting).c_str(), r.level, r.bits_per_value, r.delta_ppl_pct, r.kl,
                  r.top1_agreement, r.greedy_match);
  }
  return {{"model", q->model}, {"windows", q->windows}, {"context", q->context},
          {"continuation", q->continuation}, {"ppl_exact", q->ppl_exact}, {"rows", rows}};
}

int RunBenchTtft(BenchTtftArgs a) {
  Result<std::vector<double>> lengths = ParsePositiveList("--contexts", a.contexts);
  if (!lengths.ok()) return Fail(lengths.status());
  std::vector<uint32_t> contexts;
  for (double c : *lengths) {
    if (c != std::floor(c) || c > 1e9)
      return Fail(Status::InvalidArgument("--contexts: want whole token counts, got '" + a.contexts + "'"));
    contexts.push_back(static_cast<uint32_t>(c));
  }
  std::vector<std::pair<std::string, std::vector<RateStep>>> links;
  for (const std::string& l : SplitList(a.links)) {
    Result<double> rate = ParseRate(l);
    if (!rate.ok()) return Fail(rate.status());
    links.push_back({l, {RateStep{0, *rate}}});
  }
  std::vector<ModeSpec> modes;
  for (const std::string& name : SplitList(a.modes)) {
    Result<ModeSpec> m = Mode(name);
    if (!m.ok()) return Fail(m.status());
    modes.push_back(*m);
  }
  Result<std::shared_ptr<LlamaModel>> model = LoadBenchModel(&a.model, a.weights);
  if (!model.ok()) return Fail(model.status());
  const LlamaModelInfo& mi = (*model)->info();
  std::fprintf(stderr, "bench-ttft: %s (%u layers, %u KV heads, head dim %u), chunks of %u tokens\n", a.model.c_str(),
               mi.layers, mi.kv_heads, mi.head_dim, a.chunk_tokens);

  std::vector<Row> rows;
  for (uint32_t n : contexts) {
    // The context plus one new token (the question that reuses it): every
    // whole chunk of the context can come from the store.
    const std::vector<int32_t> prompt = PromptOf(**model, a.text, n + 1);
    const uint32_t n_ctx = n + 16;
    // (a) Full prefill: independent of the link, measured prefill_reps times
    // per context length. Its KV fills every mode's store.
    std::vector<double> prefill_ttft;
    CapturedKV captured;
    double tokens_per_s = 0, token_eval_ms = 0;
    {
      Result<std::unique_ptr<LlamaCompletionEngine>> e =
          MakeEngine(*model, nullptr, ModeSpec{"prefill", "", 0, false}, n_ctx, a, 1, 0);
      if (!e.ok()) return Fail(e.status());
      token_eval_ms = (*e)->token_eval_ms();
      for (uint32_t r = 0; r < std::max(1u, a.prefill_reps); ++r) {
        const auto t0 = Clock::now();
        Result<PrefillResult> p = (*e)->Prefill(0, prompt, 0);
        if (!p.ok()) return Fail(p.status());
        prefill_ttft.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        std::fprintf(stderr, "  %u tokens: full prefill %.0f ms\n", n, prefill_ttft.back());
      }
      tokens_per_s = n / Median(prefill_ttft) * 1000.0;
      Result<CapturedKV> cap = (*e)->Capture(0);
      if (!cap.ok()) return Fail(cap.status());
      captured = std::move(*cap);
    }
    std::fprintf(stderr, "  %u tokens: prefill %.1f tokens/s, one token %.0f ms\n", n, tokens_per_s, token_eval_ms);
    // One store per codec mode, filled with the prefill's KV (the adaptive
    // mode shares the cachegen mode's chunks: same codec settings, same keys).
    std::vector<std::unique_ptr<ChunkStore>> stores(modes.size());
    std::vector<size_t> store_of(modes.size(), 0);
    for (size_t i = 0; i < modes.size(); ++i) {
      const ModeSpec& m = modes[i];
      if (m.codec.empty()) continue;
      bool shared = false;
      for (size_t j = 0; j < i && !shared; ++j)
        if (stores[j] && modes[j].codec == m.codec && modes[j].levels == m.levels) {
          store_of[i] = j;
          shared = true;
        }
      if (shared) continue;
      store_of[i] = i;
      Result<std::unique_ptr<ChunkStore>> store = OpenStore("mem://");
      if (!store.ok()) return Fail(store.status());
      Result<std::unique_ptr<LlamaCompletionEngine>> e =
          MakeEngine(*model, store->get(), m, n_ctx, a, tokens_per_s, token_eval_ms);
      if (!e.ok()) return Fail(e.status());
      const auto t0 = Clock::now();
      Result<PutStats> put =
          (*e)->StoreContext(std::span<const int32_t>(prompt).first(n), captured.kv.view().Tokens(0, n));
      if (!put.ok()) return Fail(put.status());
      std::fprintf(stderr, "  %u tokens, %s: stored %llu bytes in %.0f ms\n", n, m.name.c_str(),
                   static_cast<unsigned long long>(put->bytes),
                   std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      stores[i] = std::move(*store);
    }
    for (const auto& link : links) {
      for (const ModeSpec& m : modes)
        if (m.codec.empty()) {
          Row r;
          r.tokens = n;
          r.link = link.first;
          r.mode = m.name;
          r.ttft_ms = r.prefill_ms = Median(prefill_ttft);
          r.runs = static_cast<uint32_t>(prefill_ttft.size());
          rows.push_back(r);
        }
      std::vector<ModeRun> runs;
      for (size_t i = 0; i < modes.size(); ++i) {
        if (modes[i].codec.empty()) continue;
        ModeRun run;
        run.mode = &modes[i];
        run.link = std::make_shared<LinkShaper>(link.second);
        ServiceOptions so;
        so.link = run.link;
        Result<std::unique_ptr<Service>> svc = Service::Start(stores[store_of[i]].get(), so);
        if (!svc.ok()) return Fail(svc.status());
        run.service = std::move(*svc);
        Result<std::unique_ptr<ChunkStore>> remote =
            ConnectService("http://127.0.0.1:" + std::to_string(run.service->port()));
        if (!remote.ok()) return Fail(remote.status());
        run.remote = std::move(*remote);
        Result<std::unique_ptr<LlamaCompletionEngine>> e =
            MakeEngine(*model, run.remote.get(), modes[i], n_ctx, a, tokens_per_s, token_eval_ms);
        if (!e.ok()) return Fail(e.status());
        run.engine = std::move(*e);
        runs.push_back(std::move(run));
      }
      // Repetitions interleave the modes (f16, q8, cachegen, f16, ...), so
      // that a change in the machine's load hits them alike. The adaptive
      // mode's target comes from the cachegen mode's runs, so it runs after them.
      auto once = [&](ModeRun& run, bool timed) -> Status {
        run.link->Restart();
        const auto t0 = Clock::now();
        Result<PrefillResult> p = run.engine->Prefill(0, prompt, run.target_ms);
        if (!p.ok()) return p.status();
        if (timed)
          run.samples.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), p->timings,
                          run.target_ms);
        return Status::Ok();
      };
      for (bool adaptive_pass : {false, true}) {
        if (adaptive_pass) {
          for (ModeRun& run : runs) {
            if (!run.mode->adaptive) continue;
            run.target_ms = a.ttft_target_ms;
            if (run.target_ms > 0) continue;
            for (const ModeRun& cg : runs)
              if (cg.mode->name == "cachegen" && !cg.samples.ttft.empty()) {
                // Half the transfer share of the best-quality load: what is
                // left after the transfer (the last token's evaluation) stays.
                const double transfer = Median(cg.samples.transfer), ttft = Median(cg.samples.ttft);
                run.target_ms = (ttft - transfer) + 0.5 * transfer;
              }
            if (run.target_ms <= 0)
              return Fail(Status::InvalidArgument("the adaptive mode needs --ttft-target-ms or the cachegen mode"));
          }
        }
        for (uint32_t r = 0; r < a.warmup + a.reps; ++r)
          for (ModeRun& run : runs) {
            if (run.mode->adaptive != adaptive_pass) continue;
            Status st = once(run, r >= a.warmup);
            if (!st.ok()) return Fail(st);
          }
      }
      for (ModeRun& run : runs) {
        run.service->Stop();
        rows.push_back(run.samples.ToRow(n, link.first, run.mode->name, run.target_ms));
        std::fprintf(stderr, "  %u tokens, %s, %s: TTFT %.0f ms (%llu bytes)\n", n, link.first.c_str(),
                     run.mode->name.c_str(), rows.back().ttft_ms, static_cast<unsigned long long>(rows.back().bytes));
      }
    }
  }

  Result<std::optional<engine::EvalReport>> quality = MeasureQuality(a, modes);
  if (!quality.ok()) return Fail(quality.status());

  auto find = [&](uint32_t n, const std::string& link, const std::string& mode) -> const Row* {
    for (const Row& r : rows)
      if (r.tokens == n && r.link == link && r.mode == mode) return &r;
    return nullptr;
  };
  nlohmann::json jrows = nlohmann::json::array();
  if (!a.json)
    std::printf("%7s %-8s %-9s %10s %8s %9s %9s %8s %8s %6s %12s %5s %8s %5s %9s %7s\n", "tokens", "link", "mode",
                "ttft_ms", "lookup", "xfer_ms", "decode", "inject", "prefill", "cached", "bytes", "level", "target",
                "met", "vs_prefill", "vs_f16");
  for (const Row& r : rows) {
    const Row* pre = find(r.tokens, r.link, "prefill");
    const Row* f16 = find(r.tokens, r.link, "f16");
    const double vs_pre = pre && pre->ttft_ms > 0 ? r.ttft_ms / pre->ttft_ms : 0;
    const double vs_f16 = f16 && f16->ttft_ms > 0 ? r.ttft_ms / f16->ttft_ms : 0;
    if (a.json) {
      jrows.push_back({{"tokens", r.tokens}, {"link", r.link}, {"mode", r.mode}, {"runs", r.runs},
                       {"ttft_ms", r.ttft_ms}, {"lookup_ms", r.lookup_ms}, {"transfer_ms", r.transfer_ms},
                       {"decode_ms", r.decode_ms}, {"inject_ms", r.inject_ms}, {"prefill_ms", r.prefill_ms},
                       {"cached_tokens", r.cached_tokens}, {"bytes", r.bytes}, {"mean_level", r.mean_level},
                       {"ttft_target_ms", r.target_ms}, {"target_met", r.target_met},
                       {"ttft_vs_prefill", vs_pre}, {"ttft_vs_f16", vs_f16}});
    } else {
      std::printf("%7u %-8s %-9s %10.1f %8.1f %9.1f %9.1f %8.1f %8.1f %6u %12llu %5.2f %8.0f %5.2f %9.4f %7.3f\n",
                  r.tokens, r.link.c_str(), r.mode.c_str(), r.ttft_ms, r.lookup_ms, r.transfer_ms, r.decode_ms,
                  r.inject_ms, r.prefill_ms, r.cached_tokens, static_cast<unsigned long long>(r.bytes), r.mean_level,
                  r.target_ms, r.target_met, vs_pre, vs_f16);
    }
  }
  nlohmann::json jquality = QualityTable(*quality, a.json);
  if (a.json)
    std::puts(nlohmann::json({{"model", a.model},
                              {"layers", mi.layers},
                              {"kv_heads", mi.kv_heads},
                              {"head_dim", mi.head_dim},
                              {"chunk_tokens", a.chunk_tokens},
                              {"weights", a.weights},
                              {"reps", a.reps},
                              {"warmup", a.warmup},
                              {"rows", jrows},
                              {"quality", jquality}})
                  .dump(2)
                  .c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(51, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchTtftArgs>();
  CLI::App* sub = root.add_subcommand(
      "bench-ttft", "Time to first token of a reused long context: prefill vs loading f16, q8, cachegen, adaptive");
  sub->add_option("--model", a->model, "GGUF model (default: a random-weight Llama-3.2-1B-shaped model, made once)");
  sub->add_option("--weights", a->weights,
                  "Weight type of the default model: f16, or quantized by llama.cpp: q8_0, q4_0, q4_k_m")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "q8_0", "q4_0", "q4_k_m"}));
  sub->add_option("--text", a->text, "Text for the prompts (default: random token ids)");
  sub->add_option("--contexts", a->contexts, "Context lengths in tokens")->capture_default_str();
  sub->add_option("--links", a->links, "Link rates (bits/s, e.g. 0.1gbit,1gbit)")
      ->capture_default_str();
  sub->add_option("--modes", a->modes, "Subset of prefill,f16,q8,cachegen,adaptive")->capture_default_str();
  sub->add_option("--reps", a->reps, "Timed repetitions of each load (median reported); modes interleave")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "Untimed loads of each mode on each link first")->capture_default_str();
  sub->add_option("--prefill-reps", a->prefill_reps, "Repetitions of the full prefill (at least 1: its KV fills the stores)")
      ->capture_default_str();
  sub->add_option("--chunk-tokens", a->chunk_tokens, "Tokens per chunk")->capture_default_str();
  sub->add_option("--threads", a->threads, "llama.cpp threads for single tokens (0: its default)")
      ->capture_default_str();
  sub->add_option("--threads-batch", a->threads_batch, "llama.cpp threads for prompt batches (0: as --threads)")
      ->capture_default_str();
  sub->add_option("--ttft-target-ms", a->ttft_target_ms,
                  "Adaptive mode's TTFT target (0: per link, the cachegen mode's median TTFT less half its median "
                  "transfer time)");
  sub->add_option("--quality-model", a->quality_model,
                  std::string("Trained GGUF that judges the modes' quality (default: ") + kSharedModel +
                      " when present; none: no quality table)");
  sub->add_option("--quality-text", a->quality_text, std::string("Text for the quality windows (default: ") +
                                                         kSharedText + ")");
  sub->add_option("--quality-windows", a->quality_windows, "Windows of 384 + 128 tokens for the quality table")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [sub, a]() -> std::optional<int> {
    if (!*sub) return std::nullopt;
    return RunBenchTtft(*a);
  };
});

}  // namespace
}  // namespace cachegen::cli
