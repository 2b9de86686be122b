// Internal: the streaming simulation's table (`cachegen bench-stream
// --simulate`, docs/SERVICE.md "Streaming decisions"): every trace at every
// time scale, deadline factor and context, a few start offsets into the
// trace each (trials), with the adaptive client, CacheGen's published policy,
// every fixed level and the oracle on the same link and decode times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/stream_client.h"
#include "stream/sim_context.h"

namespace cachegen::sim {

struct SimTableSpec {
  std::vector<std::string> traces;  // mahimahi trace files
  std::vector<double> time_scales = {100, 1000, 10000};
  // A trial's deadline, as bench-stream's: the context's level-0 decode
  // time (the mean) plus this factor x the time the link takes to deliver
  // every level-0 frame requested at once from the trial's start (a round
  // trip included).
  std::vector<double> deadline_factors = {0.3, 0.5, 0.75, 1, 1.5};
  std::vector<SimContext> contexts;
  double rtt_s = 0.001;
  uint32_t trials = 4;  // start offsets per row, drawn from the seed
  uint64_t seed = 1;
  double recompute_tokens_per_s = 5000;
  // The streaming client's settings (inflight, read_ahead, queue_ms,
  // margins); deadline, recompute speed and fixed level are set per trial.
  StreamOptions client;
};

// One policy on one row: means over the row's trials (met and feasible as
// fractions).
struct SimRow {
  std::string trace;
  double time_scale = 0;
  double deadline_factor = 0;
  std::string context;
  std::string policy;  // adaptive, published, fixed-L, oracle
  double met = 0;
  double feasible = 0;  // trials the oracle met
  double kl = 0;
  double level = 0;
  double bytes = 0;
  double recomputed = 0;
  double reissued = 0;
  double backups = 0;
};

// A policy over every trial.
struct SimSummary {
  uint32_t trials = 0;
  uint32_t feasible = 0;         // the oracle met them
  double met_of_feasible = 0;    // of those, the share the policy met
  uint32_t both_met = 0;
  double kl_vs_oracle = 0;       // its summed KL / the oracle's, over trials both met
  double level = 0;              // its mean level over trials both met
  double oracle_level = 0;       // the oracle's, over the same trials
  uint32_t fixed_feasible = 0;   // trials some fixed level met
  double not_worse_than_best_fixed = 0;  // of those, met with KL <= the finest fixed level that met
};

// The summaries of the trials of one time scale and deadline factor.
struct SimGroup {
  double time_scale = 0;
  double deadline_factor = 0;
  SimSummary adaptive, published;
};

struct SimTable {
  std::vector<SimRow> rows;
  SimSummary adaptive, published;  // over every trial
  std::vector<SimGroup> groups;    // by time scale, then deadline factor
};

Result<SimTable> RunSimTable(const SimTableSpec& spec);

}  // namespace cachegen::sim
