// The streaming simulation's table (sim_table.h).
#include "stream/sim_table.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "stream/fetch_sim.h"
#include "stream/sim_baselines.h"

namespace cachegen::sim {
namespace {

// A seed for (seed, a, b): splitmix64 steps over the three.
uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed;
  for (uint64_t v : {a, b, uint64_t{0}}) {
    x += 0x9e3779b97f4a7c15ull + v;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
  }
  return x;
}

// Sums of one policy's outcomes over a row's trials.
struct RowSums {
  int trials = 0, met = 0, feasible = 0;
  double kl = 0, level = 0, bytes = 0, recomputed = 0, reissued = 0, backups = 0;
  void Add(const SimOutcome& o, bool oracle_met) {
    ++trials;
    met += o.met;
    feasible += oracle_met;
    kl += o.kl;
    level += o.level;
    bytes += static_cast<double>(o.bytes);
    recomputed += o.recomputed;
    reissued += o.reissued;
    backups += o.backups;
  }
};

// Sums of one policy's outcomes over every trial (SimSummary).
struct SummarySums {
  uint32_t trials = 0, feasible = 0, feasible_met = 0, both_met = 0, fixed_feasible = 0, not_worse = 0;
  double kl = 0, oracle_kl = 0, level = 0, oracle_level = 0;
  void Add(const SimOutcome& o, const SimOutcome& oracle, double best_fixed_kl, bool fixed_met) {
    ++trials;
    if (oracle.met) {
      ++feasible;
      feasible_met += o.met;
    }
    if (oracle.met && o.met) {
      ++both_met;
      kl += o.kl;
      oracle_kl += oracle.kl;
      level += o.level;
      oracle_level += oracle.level;
    }
    if (fixed_met) {
      ++fixed_feasible;
      not_worse += o.met && o.kl <= best_fixed_kl * (1 + 1e-9);
    }
  }
  SimSummary Get() const {
    SimSummary s;
    s.trials = trials;
    s.feasible = feasible;
    s.met_of_feasible = feasible ? static_cast<double>(feasible_met) / feasible : 0;
    s.both_met = both_met;
    s.level = both_met ? level / both_met : 0;
    s.oracle_level = both_met ? oracle_level / both_met : 0;
    s.kl_vs_oracle = oracle_kl > 0 ? kl / oracle_kl : (kl > 0 ? INFINITY : 1.0);
    s.fixed_feasible = fixed_feasible;
    s.not_worse_than_best_fixed = fixed_feasible ? static_cast<double>(not_worse) / fixed_feasible : 0;
    return s;
  }
};

}  // namespace

Result<SimTable> RunSimTable(const SimTableSpec& spec) {
  if (spec.traces.empty() || spec.contexts.empty() || spec.time_scales.empty() || spec.deadline_factors.empty())
    return Status::InvalidArgument("simulation: needs a trace, a context, a time scale and a deadline factor");
  if (spec.trials == 0) return Status::InvalidArgument("simulation: trials must be >= 1");
  SimTable table;
  SummarySums adaptive_sums, published_sums;
  // Per (time scale, deadline factor), in the spec's order.
  std::vector<std::pair<SummarySums, SummarySums>> group_sums(spec.time_scales.size() * spec.deadline_factors.size());
  for (size_t ti = 0; ti < spec.traces.size(); ++ti) {
    const std::string trace_name = std::filesystem::path(spec.traces[ti]).stem().string();
    for (size_t si = 0; si < spec.time_scales.size(); ++si) {
      const double scale = spec.time_scales[si];
      CG_ASSIGN_OR_RETURN(const LinkTrace trace, LinkTrace::Load(spec.traces[ti], scale));
      for (size_t ci = 0; ci < spec.contexts.size(); ++ci) {
        const SimContext& context = spec.contexts[ci];
        const int levels = context.levels();
        const DecodeTimes mean_decode = MeanDecodeTimes(context);
        const DecodeTimes zero_decode(context.chunks.size(), std::vector<double>(context.levels(), 0.0));
        std::vector<int> finest(context.chunks.size());  // each chunk's finest stored level
        double decode0_s = 0;
        for (size_t c = 0; c < context.chunks.size(); ++c) {
          finest[c] = context.chunks[c].finest();
          decode0_s += mean_decode[c][finest[c]];
        }
        for (size_t fi = 0; fi < spec.deadline_factors.size(); ++fi) {
          const double factor = spec.deadline_factors[fi];
          auto& [group_adaptive, group_published] = group_sums[si * spec.deadline_factors.size() + fi];
          // Policies in table order: adaptive, published, fixed-0.., oracle.
          std::vector<RowSums> sums(levels + 3);
          for (uint32_t trial = 0; trial < spec.trials; ++trial) {
            // The same offset for every context and factor of a trace's trial.
            std::mt19937_64 rng(Mix(spec.seed, ti, trial));
            const double offset = std::uniform_real_distribution<double>(0, trace.period_s())(rng);
            const SimLink link{&trace, offset, spec.rtt_s};
            const DecodeTimes decode = DrawDecodeTimes(context, Mix(spec.seed, 1000 + ci, trial));
            // The level-0 decodes (their mean) + factor x the link's time for
            // every level-0 frame requested at once: bench-stream's deadlines.
            const double link0_s = ScorePlan(context, link, zero_decode, finest, 0, 0).total_s;
            const double deadline_s = decode0_s + factor * link0_s;
            StreamOptions o = spec.client;
            o.deadline_ms = deadline_s * 1000;
            o.recompute_tokens_per_s = spec.recompute_tokens_per_s;
            o.stop_at_deadline = false;
            o.fixed_level = -1;
            // The oracle knows the trial's whole future: the link's and each
            // decode's time. So it meets every deadline some policy met.
            const SimOutcome oracle = Oracle(context, link, decode, deadline_s, spec.recompute_tokens_per_s);
            const SimOutcome adaptive = SimulateFetch(context, link, decode, o);
            const SimOutcome published = SimulateFetch(
                context, link, decode, o,
                PublishedPolicyLevels(context, trace.mean_bytes_per_s(), deadline_s, spec.recompute_tokens_per_s));
            sums[0].Add(adaptive, oracle.met);
            sums[1].Add(published, oracle.met);
            double best_fixed_kl = 0;
            bool fixed_met = false;
            for (int l = 0; l < levels; ++l) {
              o.fixed_level = l;
              const SimOutcome fixed = SimulateFetch(context, link, decode, o);
              sums[2 + l].Add(fixed, oracle.met);
              if (fixed.met && !fixed_met) {
                fixed_met = true;
                best_fixed_kl = fixed.kl;
              }
            }
            sums[2 + levels].Add(oracle, oracle.met);
            adaptive_sums.Add(adaptive, oracle, best_fixed_kl, fixed_met);
            published_sums.Add(published, oracle, best_fixed_kl, fixed_met);
            group_adaptive.Add(adaptive, oracle, best_fixed_kl, fixed_met);
            group_published.Add(published, oracle, best_fixed_kl, fixed_met);
          }
          for (size_t p = 0; p < sums.size(); ++p) {
            const RowSums& s = sums[p];
            const double n = s.trials;
            const std::string policy = p == 0 ? "adaptive"
                                       : p == 1 ? "published"
                                       : p + 1 == sums.size() ? "oracle"
                                                              : "fixed-" + std::to_string(p - 2);
            table.rows.push_back({trace_name, scale, factor, context.name, policy, s.met / n, s.feasible / n, s.kl / n,
                                  s.level / n, s.bytes / n, s.recomputed / n, s.reissued / n, s.backups / n});
          }
        }
      }
    }
  }
  for (size_t si = 0; si < spec.time_scales.size(); ++si)
    for (size_t fi = 0; fi < spec.deadline_factors.size(); ++fi) {
      const auto& [a, p] = group_sums[si * spec.deadline_factors.size() + fi];
      table.groups.push_back({spec.time_scales[si], spec.deadline_factors[fi], a.Get(), p.Get()});
    }
  table.adaptive = adaptive_sums.Get();
  table.published = published_sums.Get();
  return table;
}

}  // namespace cachegen::sim
