// cachegen bench-stream: adaptive vs fixed-level streaming over an emulated
// link (an in-process service whose GETs pass one shared LinkShaper).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"

namespace cachegen::cli {
namespace {

struct BenchStreamArgs {
  std::string synthetic = "8,8,128,4096";
  uint32_t chunk_tokens = 256, levels = 4, inflight = 4;
  double recompute_tps = 0;
  std::string factors = "0.3,0.5,0.75,1,1.5";
};

struct Trace {
  std::string name;
  std::vector<RateStep> steps;
};

struct Stat {
  int trials = 0, met = 0, feasible = 0, feasible_met = 0, not_worse = 0;
  double level_sum = 0, bytes = 0, recomputed = 0;
  int delivered = 0;
};

int RunBenchStream(const BenchStreamArgs& a) {
  Result<SyntheticSpec> spec = ParseSyntheticSpec(a.synthetic);
  if (!spec.ok()) return Fail(spec.status());
  Result<KVTensor> kv = LoadInput("synthetic:" + a.synthetic);
  if (!kv.ok()) return Fail(kv.status());
  std::vector<TokenId> tokens(kv->shape().tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>((i * 2654435761u) % 32000);
  CodecConfig cfg;
  cfg.chunk_tokens = a.chunk_tokens;
  cfg.levels = a.levels;
  Result<Encoder> enc = Encoder::Create(cfg);
  if (!enc.ok()) return Fail(enc.status());
  Result<std::unique_ptr<ChunkStore>> store = OpenStore("mem://");
  if (!store.ok()) return Fail(store.status());
  const ChunkKey root = ChainRoot("bench", "bench", a.chunk_tokens);
  Result<PutStats> put = PutContext(**store, root, tokens, kv->view(), *enc);
  if (!put.ok()) return Fail(put.status());
  const auto keys = ChunkKeys(root, tokens, a.chunk_tokens);
  const auto found = LookupPrefix(**store, keys, a.levels);
  std::vector<double> level_bytes(a.levels, 0);
  for (const auto& c : found)
    for (uint32_t l = 0; l < a.levels && l < c.level_bytes.size(); ++l) level_bytes[l] += c.level_bytes[l];

  // Time to fetch and decode the whole context at each level from the local
  // store (median of 3 runs after a warm-up); level 0's is added to every deadline.
  std::vector<double> local_ms(a.levels);
  for (uint32_t l = 0; l < a.levels; ++l) {
    StreamOptions local;
    local.deadline_ms = 1e9;
    local.fixed_level = static_cast<int>(l);
    std::vector<double> ms;
    for (int rep = 0; rep < 4; ++rep) {
      Result<StreamResult> dec = StreamClient(store->get()).FetchTokens(root, tokens, a.chunk_tokens, local, nullptr);
      if (!dec.ok()) return Fail(dec.status());
      if (rep > 0) ms.push_back(dec->elapsed_ms);
    }
    std::sort(ms.begin(), ms.end());
    local_ms[l] = ms[ms.size() / 2];
  }
  const double decode_ms = local_ms[0];

  ServiceOptions sopts;
  sopts.threads = 16;
  std::vector<Trace> traces = {{"0.1gbit", {{0, 0.1e9 / 8}}}, {"1gbit", {{0, 1e9 / 8}}}, {"10gbit", {{0, 10e9 / 8}}}};
  const double drop_at = 0.4 * level_bytes[0] / (1e9 / 8);
  char drop_name[64];
  std::snprintf(drop_name, sizeof drop_name, "1gbit->0.1gbit@%.0fms", drop_at * 1000);
  traces.push_back({drop_name, {{0, 1e9 / 8}, {drop_at, 0.1e9 / 8}}});

  std::printf("bench-stream: %s, %u chunks of %u tokens, levels %u; MB per level:", kv->shape().ToString().c_str(),
              static_cast<unsigned>(keys.size()), a.chunk_tokens, a.levels);
  for (double b : level_bytes) std::printf(" %.2f", b / 1e6);
  std::printf("; local fetch+decode ms per level:");
  for (double ms : local_ms) std::printf(" %.0f", ms);
  std::printf(" (level 0's added to deadlines); recompute %g tok/s; inflight %u\n", a.recompute_tps, a.inflight);
  std::printf("%-24s %9s | %-28s | %5s | %-20s | %s\n", "trace", "deadline", "adaptive met/level/MB/recomp", "ms",
              "warm met/level/ms", "fixed levels 0..N-1 met (elapsed ms)");

  // "adaptive" starts cold (no bandwidth known: it probes with the first
  // chunk); "warm" starts from the estimate its previous fetch over the same
  // link ended with, as a long-lived client (llama-serve) does.
  std::vector<std::string> names = {"adaptive", "warm"};
  for (uint32_t l = 0; l < a.levels; ++l) names.push_back("fixed-" + std::to_string(l));
  std::map<std::string, Stat> stats;
  std::vector<double> factors;
  for (const std::string& f : SplitList(a.factors)) factors.push_back(std::stod(f));

  constexpr size_t kAdaptive = 2;  // clients before the fixed ones
  for (const Trace& tr : traces) {
    double warm_bandwidth = 0;
    sopts.link = std::make_shared<LinkShaper>(tr.steps);
    LinkShaper* link_ptr = sopts.link.get();
    Result<std::unique_ptr<Service>> svc = Service::Start(store->get(), sopts);
    if (!svc.ok()) return Fail(svc.status());
    Result<std::unique_ptr<ChunkStore>> remote =
        ConnectService("http://127.0.0.1:" + std::to_string((*svc)->port()));
    if (!remote.ok()) return Fail(remote.status());
    // Level 0's transfer time over this trace (for a drop: at the first rate
    // until the drop, then at the second).
    double level0_s = 0, moved = 0;
    for (size_t k = 0; k < tr.steps.size() && moved < level_bytes[0]; ++k) {
      const double span = k + 1 < tr.steps.size() ? tr.steps[k + 1].start_s - tr.steps[k].start_s : 1e30;
      const double take = std::min(level_bytes[0] - moved, span * tr.steps[k].bytes_per_s);
      level0_s += take / tr.steps[k].bytes_per_s;
      moved += take;
    }
    for (double f : factors) {
      const double deadline = decode_ms + f * level0_s * 1000.0;
      std::vector<StreamResult> results;
      for (size_t c = 0; c < names.size(); ++c) {
        StreamOptions o;
        o.deadline_ms = deadline;
        o.fixed_level = c < kAdaptive ? -1 : static_cast<int>(c - kAdaptive);
        if (c == 1) o.initial_bandwidth_bytes_s = warm_bandwidth;
        o.inflight = a.inflight;
        o.recompute_tokens_per_s = a.recompute_tps;
        o.levels = a.levels;
        link_ptr->Restart();
        Result<StreamResult> r =
            StreamClient(remote->get()).FetchTokens(root, tokens, a.chunk_tokens, o, nullptr);
        if (!r.ok()) return Fail(r.status());
        if (c == 1) warm_bandwidth = r->bandwidth_bytes_s;
        results.push_back(std::move(r).value());
      }
      int best_fixed = -1;
      for (uint32_t l = 0; l < a.levels; ++l)
        if (results[l + kAdaptive].deadline_met) {
          best_fixed = static_cast<int>(l);
          break;
        }
      auto mean_level = [](const StreamResult& r, int* n) {
        double s = 0;
        *n = 0;
        for (int l : r.levels)
          if (l >= 0) s += l, ++*n;
        return *n ? s / *n : 0.0;
      };
      for (size_t c = 0; c < names.size(); ++c) {
        Stat& s = stats[names[c]];
        const StreamResult& r = results[c];
        int n = 0;
        const double ml = mean_level(r, &n);
        ++s.trials;
        s.met += r.deadline_met;
        s.level_sum += ml * n;
        s.delivered += n;
        s.bytes += static_cast<double>(r.bytes);
        s.recomputed += static_cast<double>(r.recompute.size());
        if (best_fixed >= 0) {
          ++s.feasible;
          s.feasible_met += r.deadline_met;
          s.not_worse += r.deadline_met && r.recompute.empty() && ml <= best_fixed + 1e-9;
        }
      }
      int n = 0;
      const double ml = mean_level(results[0], &n);
      char adaptive[64];
      std::snprintf(adaptive, sizeof adaptive, "%s %.2f %6.2f %zu", results[0].deadline_met ? "yes" : "NO ", ml,
                    static_cast<double>(results[0].bytes) / 1e6, results[0].recompute.size());
      std::printf("%-24s %7.0fms | %-28s | %5.0f |", tr.name.c_str(), deadline, adaptive, results[0].elapsed_ms);
      std::printf(" %s %.2f %5.0f |", results[1].deadline_met ? "yes" : "NO ", mean_level(results[1], &n),
                  results[1].elapsed_ms);
      for (uint32_t l = 0; l < a.levels; ++l)
        std::printf(" %s(%.0f)", results[l + kAdaptive].deadline_met ? "yes" : "no", results[l + kAdaptive].elapsed_ms);
      std::printf("\n");
    }
    remote->reset();
    (*svc)->Stop();
  }
  std::printf("\n%-10s %7s %14s %11s %10s %10s %20s\n", "client", "met%", "met%feasible", "mean-level", "MB/trial",
              "recomp/tr", "not-worse-than-best");
  for (const std::string& name : names) {
    const Stat& s = stats[name];
    std::printf("%-10s %6.1f%% %13.1f%% %11.2f %10.2f %10.2f %14d/%d\n", name.c_str(), 100.0 * s.met / s.trials,
                s.feasible ? 100.0 * s.feasible_met / s.feasible : 0.0, s.delivered ? s.level_sum / s.delivered : 0.0,
                s.bytes / s.trials / 1e6, s.recomputed / s.trials, s.not_worse, s.feasible);
  }
  std::printf("feasible = some fixed-level client met the deadline in the same run; not-worse = met, nothing "
              "recomputed, mean level <= the finest fixed level that met it (0 = finest)\n");
  return 0;
}

const bool kRegistered = RegisterCommand(45, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchStreamArgs>();
  CLI::App* sub = root.add_subcommand("bench-stream",
                                      "Adaptive vs fixed-level streaming over emulated links (0.1/1/10 Gbit/s, a drop)");
  sub->add_option("--synthetic", a->synthetic, "Context L,H,D,T[,seed]")->capture_default_str();
  sub->add_option("--chunk-tokens", a->chunk_tokens, "Tokens per chunk")->capture_default_str();
  sub->add_option("--levels", a->levels, "Quality levels")->capture_default_str();
  sub->add_option("--inflight", a->inflight, "Requests in flight")->capture_default_str();
  sub->add_option("--recompute-tps", a->recompute_tps, "Engine recompute speed (tokens/s; 0 = never)")
      ->capture_default_str();
  sub->add_option("--deadline-factors", a->factors,
                  "Deadlines as multiples of the level-0 transfer time over the trace, plus the local fetch+decode time")
      ->capture_default_str();
  return [sub, a] { return *sub ? std::optional<int>(RunBenchStream(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
