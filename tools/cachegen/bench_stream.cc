// cachegen bench-stream: adaptive vs fixed-level streaming over an emulated
// link (an in-process service whose GETs pass one shared LinkShaper).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "bench_stream_sim.h"
#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"

namespace cachegen::cli {
namespace {

struct BenchStreamArgs {
  std::string synthetic = "8,8,128,4096";
  uint32_t chunk_tokens = 256, levels = 4, inflight = 4, reps = 5, decode_threads = 1;
  double recompute_tps = 0;
  std::string factors = "0.3,0.5,0.75,1,1.5";
  std::string traces = "0.1gbit,1gbit,10gbit,drop";
  bool previous = false;  // also run the client without measured margins and hedging
  SimulateArgs sim;
  uint32_t receive_path = 20;  // level-0 fetches of the receive-path report, each way (0 = none)
};

// --traces names, in the order the table runs them.
constexpr std::array<std::string_view, 4> kTraceKeys = {"0.1gbit", "1gbit", "10gbit", "drop"};

struct Trace {
  std::string_view key;  // its --traces name
  std::string name;      // as the table prints it
  std::vector<RateStep> steps;
};

// Outcomes of one client, counted per trial (one rep of one row: every
// client once, back to back) and per row (medians over the reps).
struct Stat {
  int trials = 0, met = 0, feasible = 0, feasible_met = 0, not_worse = 0;
  int rows = 0, row_met = 0, row_feasible = 0, row_feasible_met = 0, row_not_worse = 0;
  double level_sum = 0, bytes = 0, recomputed = 0;
  int delivered = 0;
};

double MeanLevel(const StreamResult& r, int* n) {
  double s = 0;
  *n = 0;
  for (int l : r.levels)
    if (l >= 0) s += l, ++*n;
  return *n ? s / *n : 0.0;
}

// Level 0's transfer time over a trace (for a drop: at the first rate until
// the drop, then at the second).
double TransferSeconds(const Trace& tr, double bytes) {
  double s = 0, moved = 0;
  for (size_t k = 0; k < tr.steps.size() && moved < bytes; ++k) {
    const double span = k + 1 < tr.steps.size() ? tr.steps[k + 1].start_s - tr.steps[k].start_s : 1e30;
    const double take = std::min(bytes - moved, span * tr.steps[k].bytes_per_s);
    s += take / tr.steps[k].bytes_per_s;
    moved += take;
  }
  return s;
}

// An in-process service over `store` whose GETs pass one shared LinkShaper
// (the emulated link), and a service client connected to it.
struct LinkedService {
  std::unique_ptr<Service> service;
  std::unique_ptr<ChunkStore> client;
  std::shared_ptr<LinkShaper> link;
  ~LinkedService() {
    client.reset();  // its keep-alive connections close before the service stops
    if (service) service->Stop();
  }
};

Result<std::unique_ptr<LinkedService>> StartLinkedService(ChunkStore* store, std::vector<RateStep> steps) {
  auto linked = std::make_unique<LinkedService>();
  ServiceOptions sopts;
  sopts.threads = 16;
  sopts.link = linked->link = std::make_shared<LinkShaper>(std::move(steps));
  Result<std::unique_ptr<Service>> svc = Service::Start(store, sopts);
  if (!svc.ok()) return svc.status();
  linked->service = std::move(svc).value();
  Result<std::unique_ptr<ChunkStore>> client =
      ConnectService("http://127.0.0.1:" + std::to_string(linked->service->port()));
  if (!client.ok()) return client.status();
  linked->client = std::move(client).value();
  return linked;
}

// Level-0 fetches of the context alternating between the local store and a
// 10 Gbit/s link (an in-process service, as in the table): at that rate the
// decoder is the bottleneck, so what the link adds is the cost of receiving
// (and, in one process, of serving). Prints medians of n each way.
Status ReceivePathReport(ChunkStore* store, const ChunkKey& root, std::span<const TokenId> tokens, uint32_t chunk_tokens,
                         uint32_t n, StreamClient& local, const StreamOptions& options) {
  Result<std::unique_ptr<LinkedService>> svc = StartLinkedService(store, {{0, 10e9 / 8}});
  if (!svc.ok()) return svc.status();
  StreamClient linked((*svc)->client.get());
  std::vector<double> ms[2], decode_ms[2], cpu_ms[2], lost;
  for (uint32_t rep = 0; rep <= n; ++rep) {  // rep 0 warms the linked client up
    for (int way = 0; way < 2; ++way) {
      (*svc)->link->Restart();
      const std::clock_t c0 = std::clock();
      Result<StreamResult> r = (way ? linked : local).FetchTokens(root, tokens, chunk_tokens, options, nullptr);
      const double cpu = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
      if (!r.ok()) return r.status();
      if (rep == 0) continue;
      ms[way].push_back(r->elapsed_ms);
      decode_ms[way].push_back(r->decode_ms);
      cpu_ms[way].push_back(cpu);
      if (way) lost.push_back(r->receive_cost_ns_per_byte);
    }
  }
  std::printf("\nReceive path (level 0, %u fetches each way, alternating; medians): local %.1f ms (decode %.1f, CPU %.1f), "
              "over a 10 Gbit/s link %.1f ms (decode %.1f, CPU %.1f, client and service); the decoder lost %.2f ns per "
              "byte received\n",
              n, Median(ms[0]), Median(decode_ms[0]), Median(cpu_ms[0]), Median(ms[1]), Median(decode_ms[1]),
              Median(cpu_ms[1]), Median(lost));
  return Status::Ok();
}

int RunBenchStream(const BenchStreamArgs& a) {
  Result<SyntheticSpec> spec = ParseSyntheticSpec(a.synthetic);
  if (!spec.ok()) return Fail(spec.status());
  Result<std::vector<double>> deadline_factors = ParsePositiveList("--deadline-factors", a.factors);
  if (!deadline_factors.ok()) return Fail(deadline_factors.status());
  const std::vector<double>& factors = *deadline_factors;
  if (!(a.recompute_tps >= 0) || !std::isfinite(a.recompute_tps))
    return Fail(Status::InvalidArgument("--recompute-tps must be a number >= 0"));
  const std::vector<std::string> wanted = SplitList(a.traces);
  if (wanted.empty()) return Fail(Status::InvalidArgument("--traces: no traces in '" + a.traces + "'"));
  for (const std::string& t : wanted)
    if (std::find(kTraceKeys.begin(), kTraceKeys.end(), t) == kTraceKeys.end())
      return Fail(Status::InvalidArgument("--traces: unknown trace '" + t + "' (want 0.1gbit, 1gbit, 10gbit, drop)"));
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
  const uint32_t reps = std::max(a.reps, 1u);

  // Time to fetch and decode the whole context at level 0 from the local
  // store, median of 5 runs after a warm-up; it is added to the deadlines.
  // Measured again before every row: the machine's load drifts, and a
  // deadline set from a quiet moment is infeasible for every client later.
  // Every client, this one included, decodes with decode_threads.
  // One client per store for every run, as a serving engine keeps one: its
  // decoded tensors are reused from fetch to fetch (StreamClient).
  StreamClient local_client(store->get());
  auto untimed = [&](int level) {  // no deadline to speak of, one fixed level
    StreamOptions o;
    o.deadline_ms = 1e9;
    o.fixed_level = level;
    o.decode_threads = a.decode_threads;
    return o;
  };
  // Every level-0 sample and each row's base, for the noise report at the end.
  std::vector<double> base_samples, row_bases;
  auto local_ms = [&](int level) -> Result<double> {
    const StreamOptions local = untimed(level);
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      Result<StreamResult> dec = local_client.FetchTokens(root, tokens, a.chunk_tokens, local, nullptr);
      if (!dec.ok()) return dec.status();
      if (rep > 0) ms.push_back(dec->elapsed_ms);
    }
    if (level == 0) base_samples.insert(base_samples.end(), ms.begin(), ms.end());
    return Median(ms);
  };
  std::vector<double> local_level_ms;
  for (uint32_t l = 0; l < a.levels; ++l) {
    Result<double> ms = local_ms(static_cast<int>(l));
    if (!ms.ok()) return Fail(ms.status());
    local_level_ms.push_back(*ms);
  }

  // The constant links print as their keys.
  std::vector<Trace> traces = {{kTraceKeys[0], std::string(kTraceKeys[0]), {{0, 0.1e9 / 8}}},
                               {kTraceKeys[1], std::string(kTraceKeys[1]), {{0, 1e9 / 8}}},
                               {kTraceKeys[2], std::string(kTraceKeys[2]), {{0, 10e9 / 8}}}};
  const double drop_at = 0.4 * level_bytes[0] / (1e9 / 8);
  char drop_name[64];
  std::snprintf(drop_name, sizeof drop_name, "1gbit->0.1gbit@%.0fms", drop_at * 1000);
  traces.push_back({kTraceKeys[3], drop_name, {{0, 1e9 / 8}, {drop_at, 0.1e9 / 8}}});
  std::erase_if(traces, [&](const Trace& t) {
    return std::find(wanted.begin(), wanted.end(), t.key) == wanted.end();
  });

  std::printf("bench-stream: %s, %u chunks of %u tokens, levels %u; MB per level:", kv->shape().ToString().c_str(),
              static_cast<unsigned>(keys.size()), a.chunk_tokens, a.levels);
  for (double b : level_bytes) std::printf(" %.2f", b / 1e6);
  std::printf("; local fetch+decode ms per level:");
  for (double ms : local_level_ms) std::printf(" %.0f", ms);
  std::printf(" (level 0's, measured again per row, added to deadlines); recompute %g tok/s; inflight %u; decode threads %u; %u reps per row, "
              "clients interleaved\n",
              a.recompute_tps, a.inflight, a.decode_threads, reps);
  std::printf("%-22s %10s | %-42s | %-16s | %s%s\n", "trace", "deadline",
              "adaptive met/R lvl MB reiss bk ms[min-max]", "warm met/R lvl ms",
              a.previous ? "previous met/R lvl MB ms | " : "", "fixed levels 0..N-1: met/R (median ms)");

  // "adaptive" starts cold (no bandwidth known: it probes with the first
  // chunk); "warm" starts from the estimate its previous fetch over the same
  // link ended with, as a long-lived client (llama-serve) does; "previous"
  // (--previous) is "adaptive" with the configured margins and no backups
  // (the client before measured margins and hedging), in the same reps.
  std::vector<std::string> names = {"adaptive", "warm"};
  if (a.previous) names.push_back("previous");
  for (uint32_t l = 0; l < a.levels; ++l) names.push_back("fixed-" + std::to_string(l));
  const size_t k = names.size();
  std::map<std::string, Stat> stats;

  const size_t kAdaptive = a.previous ? 3 : 2;  // clients before the fixed ones
  for (const Trace& tr : traces) {
    double warm_bandwidth = 0;
    Result<std::unique_ptr<LinkedService>> svc = StartLinkedService(store->get(), tr.steps);
    if (!svc.ok()) return Fail(svc.status());
    LinkShaper* link_ptr = (*svc)->link.get();
    // One untimed fetch first, as the local client's warm-up: a serving
    // engine's client has fetched before (its tensors are in memory, its
    // machine's decode costs measured: StreamClient).
    StreamClient remote_client((*svc)->client.get());
    link_ptr->Restart();
    if (Result<StreamResult> r = remote_client.FetchTokens(root, tokens, a.chunk_tokens, untimed(0), nullptr); !r.ok())
      return Fail(r.status());
    const double level0_s = TransferSeconds(tr, level_bytes[0]);
    for (double f : factors) {
      Result<double> decode_ms = local_ms(0);
      if (!decode_ms.ok()) return Fail(decode_ms.status());
      const double deadline = *decode_ms + f * level0_s * 1000.0;
      row_bases.push_back(*decode_ms);
      // results[rep][client]. Rep r runs the clients in an order rotated by
      // r, so no client always runs first or last after the others (the
      // machine's load drifts within a row too).
      std::vector<std::vector<StreamResult>> results(reps, std::vector<StreamResult>(k));
      for (uint32_t rep = 0; rep < reps; ++rep) {
        for (size_t j = 0; j < k; ++j) {
          const size_t c = (j + rep) % k;
          StreamOptions o;
          o.deadline_ms = deadline;
          o.stop_at_deadline = false;  // scored: how late a strategy delivers, not what it drops
          o.fixed_level = c < kAdaptive ? -1 : static_cast<int>(c - kAdaptive);
          if (c == 1) o.initial_bandwidth_bytes_s = warm_bandwidth;
          if (c == 2 && a.previous) o.measured_margins = o.hedge = false;
          o.inflight = a.inflight;
          o.recompute_tokens_per_s = a.recompute_tps;
          o.levels = a.levels;
          o.decode_threads = a.decode_threads;
          link_ptr->Restart();
          Result<StreamResult> r =
              remote_client.FetchTokens(root, tokens, a.chunk_tokens, o, nullptr);
          if (!r.ok()) return Fail(r.status());
          if (c == 1) warm_bandwidth = r->bandwidth_bytes_s;
          results[rep][c] = std::move(r).value();
        }
      }
      // Per trial: feasible = some fixed client met it in the same rep.
      for (uint32_t rep = 0; rep < reps; ++rep) {
        int best_fixed = -1;
        for (uint32_t l = 0; l < a.levels && best_fixed < 0; ++l)
          if (results[rep][l + kAdaptive].deadline_met) best_fixed = static_cast<int>(l);
        for (size_t c = 0; c < k; ++c) {
          Stat& s = stats[names[c]];
          const StreamResult& r = results[rep][c];
          int n = 0;
          const double ml = MeanLevel(r, &n);
          ++s.trials;
          s.met += r.deadline_met;
          s.level_sum += ml * n;
          s.delivered += n;
          s.bytes += static_cast<double>(r.bytes + r.abandoned_bytes);
          s.recomputed += static_cast<double>(r.recompute.size());
          if (best_fixed >= 0) {
            ++s.feasible;
            s.feasible_met += r.deadline_met;
            s.not_worse += r.deadline_met && r.recompute.empty() && ml <= best_fixed + 1e-9;
          }
        }
      }
      // Per row: each client's median elapsed time and median mean level
      // over the reps; feasible = some fixed client's median met it.
      std::vector<double> med_ms(k), med_level(k), min_ms(k), max_ms(k);
      std::vector<int> met_count(k, 0);
      std::vector<bool> any_recompute(k, false);
      for (size_t c = 0; c < k; ++c) {
        std::vector<double> ms, lv;
        for (uint32_t rep = 0; rep < reps; ++rep) {
          const StreamResult& r = results[rep][c];
          int n = 0;
          ms.push_back(r.elapsed_ms);
          lv.push_back(MeanLevel(r, &n));
          met_count[c] += r.deadline_met;
          any_recompute[c] = any_recompute[c] || !r.recompute.empty();
        }
        med_ms[c] = Median(ms);
        med_level[c] = Median(lv);
        min_ms[c] = *std::min_element(ms.begin(), ms.end());
        max_ms[c] = *std::max_element(ms.begin(), ms.end());
      }
      int best_fixed = -1;
      for (uint32_t l = 0; l < a.levels && best_fixed < 0; ++l)
        if (med_ms[l + kAdaptive] <= deadline) best_fixed = static_cast<int>(l);
      for (size_t c = 0; c < k; ++c) {
        Stat& s = stats[names[c]];
        const bool met = med_ms[c] <= deadline;
        ++s.rows;
        s.row_met += met;
        if (best_fixed >= 0) {
          ++s.row_feasible;
          s.row_feasible_met += met;
          s.row_not_worse += met && !any_recompute[c] && med_level[c] <= best_fixed + 1e-9;
        }
      }
      auto moved_mb = [&](size_t c) {
        double moved = 0;
        for (uint32_t rep = 0; rep < reps; ++rep)
          moved += static_cast<double>(results[rep][c].bytes + results[rep][c].abandoned_bytes);
        return moved / reps / 1e6;
      };
      double reissued = 0, backups = 0;
      for (uint32_t rep = 0; rep < reps; ++rep) {
        reissued += results[rep][0].reissued;
        backups += results[rep][0].backups;
      }
      char adaptive[96], warm[48], previous[64] = "";
      std::snprintf(adaptive, sizeof adaptive, "%s %u/%u %.2f %5.2f %3.1f %4.1f %4.0f[%.0f-%.0f]",
                    med_ms[0] <= deadline ? "yes" : "NO ", static_cast<unsigned>(met_count[0]), reps, med_level[0],
                    moved_mb(0), reissued / reps, backups / reps, med_ms[0], min_ms[0], max_ms[0]);
      std::snprintf(warm, sizeof warm, "%s %u/%u %.2f %4.0f", med_ms[1] <= deadline ? "yes" : "NO ",
                    static_cast<unsigned>(met_count[1]), reps, med_level[1], med_ms[1]);
      if (a.previous)
        std::snprintf(previous, sizeof previous, "%s %u/%u %.2f %5.2f %4.0f | ", med_ms[2] <= deadline ? "yes" : "NO ",
                      static_cast<unsigned>(met_count[2]), reps, med_level[2], moved_mb(2), med_ms[2]);
      std::printf("%-22s %4.0f+%4.0fms | %-42s | %-16s | %s", tr.name.c_str(), *decode_ms, deadline - *decode_ms,
                  adaptive, warm, previous);
      for (uint32_t l = 0; l < a.levels; ++l)
        std::printf(" %s%u/%u(%.0f)", med_ms[l + kAdaptive] <= deadline ? "+" : "-",
                    static_cast<unsigned>(met_count[l + kAdaptive]), reps, med_ms[l + kAdaptive]);
      std::printf("\n");
    }
  }
  // The machine's own noise, with no link and no service: a deadline of
  // base + x ms is out of every client's reach while the machine runs more
  // than x ms slower than when the row's base was measured.
  std::sort(base_samples.begin(), base_samples.end());
  std::sort(row_bases.begin(), row_bases.end());  // not empty: a trace and a factor at least (checked above)
  std::printf("\nLocal level-0 fetch+decode, the deadlines' base (%zu fetches over the run, 5 per base): min %.0f, "
              "median %.0f, p90 %.0f, max %.0f ms; the rows' bases %.0f-%.0f ms\n",
              base_samples.size(), Percentile(base_samples, 0), Percentile(base_samples, 0.5),
              Percentile(base_samples, 0.9), Percentile(base_samples, 1),
              row_bases.front(), row_bases.back());
  if (a.receive_path > 0) {
    const Status st = ReceivePathReport(store->get(), root, tokens, a.chunk_tokens, a.receive_path, local_client, untimed(0));
    if (!st.ok()) return Fail(st);
  }
  std::printf("\nPer trial (one rep of one row):\n%-10s %7s %14s %11s %10s %10s %20s\n", "client", "met%",
              "met%feasible", "mean-level", "MB/trial", "recomp/tr", "not-worse-than-best");
  for (const std::string& name : names) {
    const Stat& s = stats[name];
    std::printf("%-10s %6.1f%% %13.1f%% %11.2f %10.2f %10.2f %14d/%d\n", name.c_str(), 100.0 * s.met / s.trials,
                s.feasible ? 100.0 * s.feasible_met / s.feasible : 0.0, s.delivered ? s.level_sum / s.delivered : 0.0,
                s.bytes / s.trials / 1e6, s.recomputed / s.trials, s.not_worse, s.feasible);
  }
  std::printf("\nPer row (medians of %u reps):\n%-10s %7s %14s %20s\n", reps, "client", "met%", "met%feasible",
              "not-worse-than-best");
  for (const std::string& name : names) {
    const Stat& s = stats[name];
    std::printf("%-10s %6.1f%% %13.1f%% %14d/%d\n", name.c_str(), 100.0 * s.row_met / s.rows,
                s.row_feasible ? 100.0 * s.row_feasible_met / s.row_feasible : 0.0, s.row_not_worse,
                s.row_feasible);
  }
  std::printf("feasible = some fixed-level client met the deadline (per trial: in the same rep; per row: by its median "
              "time); not-worse = met, nothing recomputed, mean level <= the finest fixed level that met it (0 = "
              "finest; per row: median mean level); MB counts abandoned requests' and backups' bytes; row columns: "
              "met/R = reps that met it, yes/NO and +/- = the median met it, reiss = requests abandoned per rep, bk = "
              "backups per rep\n");
  return 0;
}

const bool kRegistered = RegisterCommand(45, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<BenchStreamArgs>();
  CLI::App* sub = root.add_subcommand("bench-stream",
                                      "Streaming: adaptive vs fixed levels over emulated links (0.1/1/10 Gbit/s, a drop), or with --simulate on link traces against an oracle");
  sub->add_option("--synthetic", a->synthetic, "Context L,H,D,T[,seed]")->capture_default_str();
  sub->add_option("--chunk-tokens", a->chunk_tokens, "Tokens per chunk")->capture_default_str();
  sub->add_option("--levels", a->levels, "Quality levels")->capture_default_str();
  sub->add_option("--inflight", a->inflight, "Requests in flight (the simulated client's too)")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  sub->add_option("--traces", a->traces, "Links to run: 0.1gbit, 1gbit, 10gbit, drop (1 -> 0.1 Gbit/s)")
      ->capture_default_str();
  sub->add_option("--reps", a->reps, "Runs of every client per row (interleaved; rows report medians)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--decode-threads", a->decode_threads, "Decode threads of every client (and the local measure)")
      ->capture_default_str();
  sub->add_flag("--previous", a->previous,
               "Also run the adaptive client with the configured margins and no backups (the client before "
               "measured margins and hedging), interleaved with the others");
  sub->add_option("--receive-path", a->receive_path,
                  "Level-0 fetches each way (local, 10 Gbit/s link), alternating, for the receive-path line (0 = none)")
      ->capture_default_str();
  sub->add_option("--recompute-tps", a->recompute_tps, "Engine recompute speed (tokens/s; 0 = never)")
      ->capture_default_str();
  sub->add_option("--deadline-factors", a->factors,
                  "Deadlines as multiples of the level-0 transfer time over the trace, plus the local fetch+decode time")
      ->capture_default_str();
  AddSimulateOptions(sub, &a->sim);
  return [sub, a]() -> std::optional<int> {
    if (!*sub) return std::nullopt;
    if (!a->sim.make_context.empty()) return RunMakeContext(a->sim);
    if (a->sim.simulate) return RunSimulation(a->sim, a->factors, a->inflight);
    return RunBenchStream(*a);
  };
});

}  // namespace
}  // namespace cachegen::cli
