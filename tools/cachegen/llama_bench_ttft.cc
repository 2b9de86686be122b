// cachegen bench-ttft: time to first token of a long, reused context, loaded
// five ways over an emulated link, all in one run:
//   prefill   no cache: the engine prefills the whole prompt
//   f16       the raw f16 KV from the store (what llama.cpp's slot restore moves)
//   q8        block-32 8-bit KV
//   cachegen  the cachegen codec at its default rate, always the best level
//   adaptive  cachegen with 4 levels and a deadline: levels picked per chunk
// The link is the chunk service's rate limit (a real HTTP service on
// loopback); TTFT = lookup + transfer + decode + inject + prefill of the
// uncached tail + sampling the first token.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/service.h"
#include "cachegen/store.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/random_model.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchTtftArgs {
  std::string model, text;
  std::string contexts = "1024,2048,4096";
  std::string links = "0.1gbit,1gbit,10gbit";
  std::string modes = "prefill,f16,q8,cachegen,adaptive";
  uint32_t reps = 3, prefill_reps = 1, chunk_tokens = 256, threads = 0;
  double deadline_ms = 0;  // adaptive: 0 = half of the cachegen mode's median TTFT on the same link
  bool json = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

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
  uint32_t tokens;
  std::string link, mode;
  double ttft_ms, transfer_ms, decode_ms, inject_ms, prefill_ms, deadline_ms;
  uint64_t bytes;
  double mean_level;
  uint32_t cached_tokens;
  double deadline_met;
};

// One engine per mode (its codec roots its own key chain) over `store`.
Result<std::unique_ptr<LlamaCompletionEngine>> MakeEngine(const std::shared_ptr<LlamaModel>& model,
                                                          ChunkStore* store, const ModeSpec& m, uint32_t n_ctx,
                                                          const BenchTtftArgs& a, double tokens_per_s) {
  LlamaServeOptions o;
  o.n_ctx = n_ctx;
  o.threads = a.threads;
  o.model_fingerprint = "bench-ttft";
  o.codec.codec = m.codec.empty() ? "fp16" : m.codec;
  o.codec.levels = m.levels ? m.levels : 1;
  o.codec.chunk_tokens = a.chunk_tokens;
  o.fixed_level = m.adaptive ? -1 : 0;
  o.recompute_tokens_per_s = tokens_per_s;
  return LlamaCompletionEngine::Create(model, m.codec.empty() ? nullptr : store, o);
}

Result<std::shared_ptr<LlamaModel>> LoadBenchModel(std::string* path) {
  if (!path->empty()) return LlamaModel::Load(*path);
  const std::string cached = (std::filesystem::temp_directory_path() / "cachegen-llama-3.2-1b-random.gguf").string();
  if (!std::filesystem::exists(cached)) {
    std::fprintf(stderr, "bench-ttft: writing a random-weight Llama-3.2-1B-shaped model to %s (once)\n", cached.c_str());
    Result<engine::RandomModelShape> shape = engine::RandomModelPreset("llama-3.2-1b");
    if (!shape.ok()) return shape.status();
    const std::string tmp = cached + ".tmp";
    Result<uint64_t> w = engine::WriteRandomModel(*shape, tmp);
    if (!w.ok()) return w.status();
    std::filesystem::rename(tmp, cached);
  }
  *path = cached;
  return LlamaModel::Load(cached);
}

int RunBenchTtft(BenchTtftArgs a) {
  std::vector<uint32_t> contexts;
  for (const std::string& c : SplitList(a.contexts)) contexts.push_back(static_cast<uint32_t>(std::stoul(c)));
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
  Result<std::shared_ptr<LlamaModel>> model = LoadBenchModel(&a.model);
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
    double prefill_tokens_per_s = 0;
    // Full prefill: independent of the link, measured once per context length.
    std::vector<double> prefill_ttft;
    {
      Result<std::unique_ptr<LlamaCompletionEngine>> e = MakeEngine(*model, nullptr, modes[0], n_ctx, a, 1);
      if (!e.ok()) return Fail(e.status());
      for (uint32_t r = 0; r < a.prefill_reps; ++r) {
        const auto t0 = Clock::now();
        Result<PrefillResult> p = (*e)->Prefill(0, prompt, 0);
        if (!p.ok()) return Fail(p.status());
        prefill_ttft.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        std::fprintf(stderr, "  %u tokens: full prefill %.0f ms\n", n, prefill_ttft.back());
      }
      prefill_tokens_per_s = n / Median(prefill_ttft) * 1000.0;
    }
    for (const ModeSpec& m : modes) {
      if (m.codec.empty()) {
        for (const auto& link : links)
          rows.push_back({n, link.first, m.name, Median(prefill_ttft), 0, 0, 0, Median(prefill_ttft), 0, 0, 0, 0, 1});
        continue;
      }
      // Populate a store with this mode's chunks (unshaped), then serve it
      // through the rate-limited service for each link.
      Result<std::unique_ptr<ChunkStore>> store = OpenStore("mem://");
      if (!store.ok()) return Fail(store.status());
      {
        Result<std::unique_ptr<LlamaCompletionEngine>> e =
            MakeEngine(*model, store->get(), m, n_ctx, a, prefill_tokens_per_s);
        if (!e.ok()) return Fail(e.status());
        Result<PrefillResult> p = (*e)->Prefill(0, prompt, 0);
        if (!p.ok()) return Fail(p.status());
        (*e)->FlushStores();
      }
      for (const auto& link : links) {
        ServiceOptions so;
        so.link = std::make_shared<LinkShaper>(link.second);
        Result<std::unique_ptr<Service>> svc = Service::Start(store->get(), so);
        if (!svc.ok()) return Fail(svc.status());
        Result<std::unique_ptr<ChunkStore>> remote =
            ConnectService("http://127.0.0.1:" + std::to_string((*svc)->port()));
        if (!remote.ok()) return Fail(remote.status());
        Result<std::unique_ptr<LlamaCompletionEngine>> e =
            MakeEngine(*model, remote->get(), m, n_ctx, a, prefill_tokens_per_s);
        if (!e.ok()) return Fail(e.status());
        double deadline = 0;
        if (m.adaptive) {
          deadline = a.deadline_ms;
          if (deadline <= 0)
            for (const Row& r : rows)
              if (r.tokens == n && r.link == link.first && r.mode == "cachegen") deadline = 0.5 * r.ttft_ms;
        }
        std::vector<double> ttft, transfer, decode, inject, prefill, levels;
        uint64_t bytes = 0;
        uint32_t cached = 0, met = 0;
        for (uint32_t r = 0; r < a.reps; ++r) {
          so.link->Restart();
          const auto t0 = Clock::now();
          Result<PrefillResult> p = (*e)->Prefill(0, prompt, deadline);
          if (!p.ok()) return Fail(p.status());
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          ttft.push_back(ms);
          const serve::Timings& t = p->timings;
          transfer.push_back(t.transfer_ms);
          decode.push_back(t.decode_ms);
          inject.push_back(t.inject_ms);
          prefill.push_back(t.prefill_ms);
          double lsum = 0;
          for (uint32_t l : t.levels) lsum += l;
          levels.push_back(t.levels.empty() ? 0 : lsum / t.levels.size());
          bytes = t.transfer_bytes;
          cached = t.cached_tokens;
          if (deadline <= 0 || ms <= deadline) ++met;
        }
        (*svc)->Stop();
        rows.push_back({n, link.first, m.name, Median(ttft), Median(transfer), Median(decode), Median(inject),
                        Median(prefill), deadline, bytes, Median(levels), cached,
                        static_cast<double>(met) / a.reps});
        std::fprintf(stderr, "  %u tokens, %s, %s: TTFT %.0f ms (%llu bytes)\n", n, link.first.c_str(),
                     m.name.c_str(), rows.back().ttft_ms, static_cast<unsigned long long>(bytes));
      }
    }
  }

  auto find = [&](uint32_t n, const std::string& link, const std::string& mode) -> const Row* {
    for (const Row& r : rows)
      if (r.tokens == n && r.link == link && r.mode == mode) return &r;
    return nullptr;
  };
  nlohmann::json jrows = nlohmann::json::array();
  if (!a.json)
    std::printf("%7s %-8s %-9s %10s %9s %9s %8s %8s %9s %12s %6s %9s %9s\n", "tokens", "link", "mode", "ttft_ms",
                "xfer_ms", "decode", "inject", "prefill", "cached", "bytes", "level", "vs_prefill", "vs_f16");
  for (const Row& r : rows) {
    const Row* pre = find(r.tokens, r.link, "prefill");
    const Row* f16 = find(r.tokens, r.link, "f16");
    const double vs_pre = pre && pre->ttft_ms > 0 ? r.ttft_ms / pre->ttft_ms : 0;
    const double vs_f16 = f16 && f16->ttft_ms > 0 ? r.ttft_ms / f16->ttft_ms : 0;
    if (a.json) {
      jrows.push_back({{"tokens", r.tokens}, {"link", r.link}, {"mode", r.mode}, {"ttft_ms", r.ttft_ms},
                       {"transfer_ms", r.transfer_ms}, {"decode_ms", r.decode_ms}, {"inject_ms", r.inject_ms},
                       {"prefill_ms", r.prefill_ms}, {"cached_tokens", r.cached_tokens}, {"bytes", r.bytes},
                       {"mean_level", r.mean_level}, {"deadline_ms", r.deadline_ms},
                       {"deadline_met", r.deadline_met}, {"ttft_vs_prefill", vs_pre}, {"ttft_vs_f16", vs_f16}});
    } else {
      std::printf("%7u %-8s %-9s %10.1f %9.1f %9.1f %8.1f %8.1f %9u %12llu %6.2f %9.3f %9.3f\n", r.tokens,
                  r.link.c_str(), r.mode.c_str(), r.ttft_ms, r.transfer_ms, r.decode_ms, r.inject_ms, r.prefill_ms,
                  r.cached_tokens, static_cast<unsigned long long>(r.bytes), r.mean_level, vs_pre, vs_f16);
    }
  }
  if (a.json)
    std::puts(nlohmann::json({{"model", a.model},
                              {"layers", mi.layers},
                              {"kv_heads", mi.kv_heads},
                              {"head_dim", mi.head_dim},
                              {"chunk_tokens", a.chunk_tokens},
                              {"reps", a.reps},
                              {"rows", jrows}})
                  .dump(2)
                  .c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(51, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchTtftArgs>();
  CLI::App* sub = root.add_subcommand(
      "bench-ttft", "Time to first token of a reused long context: prefill vs loading f16, q8, cachegen, adaptive");
  sub->add_option("--model", a->model, "GGUF model (default: a random-weight Llama-3.2-1B-shaped model, made once)");
  sub->add_option("--text", a->text, "Text for the prompts (default: random token ids)");
  sub->add_option("--contexts", a->contexts, "Context lengths in tokens")->capture_default_str();
  sub->add_option("--links", a->links, "Link rates (bits/s, e.g. 0.1gbit,1gbit)")
      ->capture_default_str();
  sub->add_option("--modes", a->modes, "Subset of prefill,f16,q8,cachegen,adaptive")->capture_default_str();
  sub->add_option("--reps", a->reps, "Repetitions of each load (median reported)")->capture_default_str();
  sub->add_option("--prefill-reps", a->prefill_reps, "Repetitions of the full prefill")->capture_default_str();
  sub->add_option("--chunk-tokens", a->chunk_tokens, "Tokens per chunk")->capture_default_str();
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  sub->add_option("--deadline-ms", a->deadline_ms, "Adaptive mode's deadline (0: half the cachegen mode's TTFT)");
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [sub, a]() -> std::optional<int> {
    if (!*sub) return std::nullopt;
    return RunBenchTtft(*a);
  };
});

}  // namespace
}  // namespace cachegen::cli
