// cachegen bench-stream --simulate / --make-context (bench_stream_sim.h).
#include "bench_stream_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/codec.h"
#include "stream/sim_table.h"

namespace cachegen::cli {
namespace {

// Where the defaults are: the shared traces beside a clone, and the
// contexts committed with it (measured on docs6L: bench/stream/README.md).
constexpr const char* kSharedTraces = "../shared/data/traces";
constexpr const char* kContextsDir = "bench/stream";

std::vector<std::string> FilesIn(const std::string& dir, const std::string& extension) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == extension) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void PrintTable(const sim::SimTable& t) {
  std::printf("%-22s %7s %6s %-14s %-10s %5s %5s %10s %5s %8s %6s %6s %6s\n", "trace", "scale", "factor", "context",
              "policy", "met", "feas", "kl", "level", "MB", "recomp", "reiss", "backup");
  for (const sim::SimRow& r : t.rows)
    std::printf("%-22s %7g %6g %-14s %-10s %5.2f %5.2f %10.3e %5.2f %8.3f %6.2f %6.2f %6.2f\n", r.trace.c_str(),
                r.time_scale, r.deadline_factor, r.context.c_str(), r.policy.c_str(), r.met, r.feasible, r.kl, r.level,
                r.bytes / 1e6, r.recomputed, r.reissued, r.backups);
  std::printf("\nBy time scale and deadline factor (trials over every trace and context): oracle-feasible trials; "
              "met of those; KL / the oracle's and mean levels over the trials both met\n");
  std::printf("%7s %6s %9s | %-34s | %-22s\n", "scale", "factor", "feasible", "adaptive met  KL/oracle  level(oracle)",
              "published met  KL/oracle");
  for (const sim::SimGroup& g : t.groups)
    std::printf("%7g %6g %5u/%-3u | %6.1f%% %9.2fx %7.2f (%.2f) | %6.1f%% %9.2fx\n", g.time_scale, g.deadline_factor,
                g.adaptive.feasible, g.adaptive.trials, 100 * g.adaptive.met_of_feasible, g.adaptive.kl_vs_oracle,
                g.adaptive.level, g.adaptive.oracle_level, 100 * g.published.met_of_feasible, g.published.kl_vs_oracle);
  for (const auto& [name, s] : {std::pair{"adaptive", t.adaptive}, std::pair{"published", t.published}})
    std::printf("%s: %u trials, oracle met %u; met %.1f%% of those; KL %.3fx the oracle's over the %u both met; "
                "not worse than the finest fixed level that met in %.1f%% of %u trials\n",
                name, s.trials, s.feasible, 100 * s.met_of_feasible, s.kl_vs_oracle, s.both_met,
                100 * s.not_worse_than_best_fixed, s.fixed_feasible);
}

void PrintJson(const sim::SimTable& t) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const sim::SimRow& r : t.rows)
    rows.push_back({{"trace", r.trace}, {"time_scale", r.time_scale}, {"deadline_factor", r.deadline_factor},
                    {"context", r.context}, {"policy", r.policy}, {"met", r.met}, {"feasible", r.feasible},
                    {"kl", r.kl}, {"level", r.level}, {"bytes", r.bytes}, {"recomputed", r.recomputed},
                    {"reissued", r.reissued}, {"backups", r.backups}});
  auto summary = [](const sim::SimSummary& s) {
    return nlohmann::ordered_json{{"met_of_feasible", s.met_of_feasible},
                                  {"kl_vs_oracle", s.kl_vs_oracle},
                                  {"not_worse_than_best_fixed", s.not_worse_than_best_fixed},
                                  {"trials", s.trials},
                                  {"feasible", s.feasible},
                                  {"both_met", s.both_met},
                                  {"fixed_feasible", s.fixed_feasible}};
  };
  nlohmann::ordered_json j;
  j["rows"] = std::move(rows);
  j["summary"] = summary(t.adaptive);
  j["published"] = summary(t.published);
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void AddSimulateOptions(CLI::App* sub, SimulateArgs* a) {
  sub->add_flag("--simulate", a->simulate,
                "Judge the streaming decisions in a deterministic simulation on link traces against an oracle "
                "(docs/SERVICE.md, \"Streaming decisions\") instead of streaming over emulated links");
  sub->add_option("--trace", a->traces,
                  "--simulate: a mahimahi link trace (repeatable; default: the shared traces beside the clone)");
  sub->add_option("--time-scale", a->time_scales,
                  "--simulate: time scales S (a trace's time axis divided by S: an S-fold faster link)")
      ->capture_default_str();
  sub->add_option("--rtt-ms", a->rtt_ms, "--simulate: time from a request to its first byte")
      ->check(NonNegative())
      ->capture_default_str();
  sub->add_option("--contexts", a->contexts,
                  "--simulate: contexts (JSON from --make-context; repeatable; default: bench/stream/*.json)");
  sub->add_option("--trials", a->trials, "--simulate: start offsets into the trace per row")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "--simulate: seed of the offsets and decode-time noise")->capture_default_str();
  sub->add_option("--sim-recompute-tps", a->recompute_tps,
                  "--simulate: the engine's recompute speed (tokens/s; 0 = never recompute)")
      ->check(NonNegative())
      ->capture_default_str();
  sub->add_flag("--json", a->json, "--simulate: print one JSON object");
  sub->add_option("--make-context", a->make_context,
                  "Write a simulation context from encoded containers (.cgkv at every level; repeatable, chunks in "
                  "order): frame sizes, and decode times measured here");
  sub->add_option("--kl", a->kl, "--make-context: the model's KL per level (comma list, from cachegen eval)");
  sub->add_option("--profile", a->profile, "--make-context: the model profile the containers were coded with");
  sub->add_option("--name", a->name, "--make-context: the context's name");
  sub->add_option("-o,--output", a->output, "--make-context: the JSON file to write");
  sub->add_option("--decode-reps", a->reps, "--make-context: decodes of every frame (medians)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
}

int RunSimulation(const SimulateArgs& a, const std::string& factors, uint32_t inflight) {
  sim::SimTableSpec spec;
  spec.traces = a.traces.empty() ? FilesIn(kSharedTraces, ".down") : a.traces;
  if (spec.traces.empty())
    return Fail(Status::InvalidArgument(std::string("--simulate: no --trace given and no traces in ") + kSharedTraces));
  const std::vector<std::string> context_paths = a.contexts.empty() ? FilesIn(kContextsDir, ".json") : a.contexts;
  if (context_paths.empty())
    return Fail(Status::InvalidArgument(std::string("--simulate: no --contexts given and none in ") + kContextsDir));
  for (const std::string& p : context_paths) {
    Result<sim::SimContext> c = sim::LoadSimContext(p);
    if (!c.ok()) return Fail(c.status());
    if (c->name.empty()) c->name = std::filesystem::path(p).stem().string();
    spec.contexts.push_back(std::move(c).value());
  }
  Result<std::vector<double>> scales = ParsePositiveList("--time-scale", a.time_scales);
  if (!scales.ok()) return Fail(scales.status());
  Result<std::vector<double>> f = ParsePositiveList("--deadline-factors", factors);
  if (!f.ok()) return Fail(f.status());
  spec.time_scales = *scales;
  spec.deadline_factors = *f;
  spec.rtt_s = a.rtt_ms / 1000;
  spec.trials = a.trials;
  spec.seed = a.seed;
  spec.recompute_tokens_per_s = a.recompute_tps;
  spec.client.inflight = inflight;
  Result<sim::SimTable> t = sim::RunSimTable(spec);
  if (!t.ok()) return Fail(t.status());
  if (a.json) PrintJson(*t);
  else PrintTable(*t);
  return 0;
}

int RunMakeContext(const SimulateArgs& a) {
  if (a.output.empty()) return Fail(Status::InvalidArgument("--make-context needs -o FILE.json"));
  Result<std::vector<double>> kl = ParsePositiveList("--kl", a.kl);
  if (!kl.ok()) return Fail(kl.status());
  if (kl->empty()) return Fail(Status::InvalidArgument("--make-context needs --kl (the model's KL per level)"));
  Result<std::shared_ptr<const ProfileSet>> profiles = DecodeProfiles(a.profile);
  if (!profiles.ok()) return Fail(profiles.status());
  sim::SimContext context;
  context.name = a.name.empty() ? std::filesystem::path(a.output).stem().string() : a.name;
  context.level_kl = *kl;
  const size_t levels = kl->size();
  std::vector<double> level_s(levels, 0), level_tokens(levels, 0);
  std::vector<std::pair<size_t, double>> samples;  // (level, seconds per token)
  for (const std::string& path : a.make_context) {
    Result<std::vector<uint8_t>> bytes = ReadFileBytes(path);
    if (!bytes.ok()) return Fail(bytes.status());
    Result<Decoder> dec = Decoder::Open(*bytes, profiles->get());
    if (!dec.ok()) return Fail(Status::InvalidArgument(path + ": " + dec.status().ToString()));
    if (dec->info().levels != levels)
      return Fail(Status::InvalidArgument(path + ": " + std::to_string(dec->info().levels) + " levels, --kl lists " +
                                          std::to_string(levels)));
    for (uint32_t c = 0; c < dec->info().chunks.size(); ++c) {
      PlanChunk chunk;
      chunk.tokens = dec->info().chunks[c].tokens;
      for (uint32_t l = 0; l < levels; ++l) {
        Result<std::span<const uint8_t>> frame = dec->Frame(c, l);
        if (!frame.ok()) return Fail(frame.status());
        chunk.level_bytes.push_back(frame->size());
        Result<FrameInfo> info = InspectFrame(*frame);
        if (!info.ok()) return Fail(info.status());
        KVTensor out = KVTensor::Unfilled(info->shape, DType::kF16);
        std::vector<double> s;
        for (uint32_t rep = 0; rep <= a.reps; ++rep) {  // rep 0 warms the tensor's pages
          const auto t0 = std::chrono::steady_clock::now();
          if (Status st = DecodeFrame(*frame, out.view(), 1, profiles->get()); !st.ok()) return Fail(st);
          if (rep > 0) s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        const double median = Median(s);
        level_s[l] += median;
        level_tokens[l] += chunk.tokens;
        for (double x : s) samples.emplace_back(l, x / chunk.tokens);
      }
      context.chunks.push_back(std::move(chunk));
    }
  }
  if (context.chunks.empty()) return Fail(Status::InvalidArgument("--make-context: no chunks"));
  for (size_t l = 0; l < levels; ++l) context.decode_s_per_token.push_back(level_s[l] / level_tokens[l]);
  double sq = 0;
  for (const auto& [l, x] : samples) {
    const double r = x / context.decode_s_per_token[l] - 1;
    sq += r * r;
  }
  context.decode_cv = std::sqrt(sq / static_cast<double>(samples.size()));
  context.source = "cachegen bench-stream --make-context";
  for (const std::string& p : a.make_context) context.source += " " + std::filesystem::path(p).filename().string();
  context.source += " --kl " + a.kl;
  std::ofstream out(a.output, std::ios::binary);
  out << sim::SimContextJson(context);
  if (!out.good()) return Fail(Status::IOError("cannot write " + a.output));
  std::printf("%s: %zu chunks, MB per level:", a.output.c_str(), context.chunks.size());
  for (size_t l = 0; l < levels; ++l) std::printf(" %.3f", context.LevelBytes(static_cast<int>(l)) / 1e6);
  std::printf("; decode ns/token per level:");
  for (double d : context.decode_s_per_token) std::printf(" %.0f", d * 1e9);
  std::printf("; decode cv %.3f\n", context.decode_cv);
  return 0;
}

}  // namespace cachegen::cli
