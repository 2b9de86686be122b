// Internal: the streaming simulation (issue "streaming decisions judged on
// real link traces"). A fetch runs the client's own decisions (FetchSession)
// on a virtual clock against a modelled link (a trace, LinkQueue) and a
// modelled decoder (per chunk and level decode times with seeded noise), so
// the same seed gives the same outcome on any machine. Quality is scored in
// the model's own terms: the KL each level costs (from `cachegen eval`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stream/planner.h"
#include "cachegen/status.h"
#include "cachegen/stream_client.h"
#include "stream/link_trace.h"
#include "stream/sim_context.h"

namespace cachegen::sim {

// One trial's link: a trace read from offset_s on, and the time from a
// request to its first byte's earliest arrival.
struct SimLink {
  const LinkTrace* trace = nullptr;
  double offset_s = 0;
  double rtt_s = 0;
};

// Decode seconds of each chunk at each level in one trial: the context's
// mean times with Gaussian noise of its decode_cv (clamped to [0.2, 5]x),
// drawn from `seed`. Every policy of a trial sees the same ones.
using DecodeTimes = std::vector<std::vector<double>>;  // [chunk][level]
DecodeTimes DrawDecodeTimes(const SimContext& context, uint64_t seed);
// The mean times, without noise.
DecodeTimes MeanDecodeTimes(const SimContext& context);

// What one fetch came to.
struct SimOutcome {
  bool met = false;         // total_s <= the deadline
  double total_s = 0;       // fetch end, then recomputing its chunks (at the recompute speed)
  double kl = 0;            // ContextKl of the levels delivered
  double level = 0;         // mean level of the chunks delivered (recomputed ones left out)
  uint64_t bytes = 0;       // moved over the link, abandoned requests and backups included
  uint32_t recomputed = 0;  // chunks
  uint32_t reissued = 0;
  uint32_t backups = 0;
  double bandwidth_bytes_s = 0;  // the client's estimate of the link at the end; 0 = none formed
  std::vector<int> levels;  // per chunk, -1 = recomputed
};

// Token-weighted mean KL of a context delivered at `levels` (-1 = recomputed:
// exact, 0). A model: chunks at different levels are taken to add their
// shares of each level's context-wide KL.
double ContextKl(const SimContext& context, const std::vector<int>& levels);

// Seconds to recompute `tokens` at `tokens_per_s`; infinity when it is 0.
double RecomputeSeconds(uint64_t tokens, double tokens_per_s);

// Fetches `context` over `link` with the streaming client's policy under
// `options` (deadline_ms, recompute_tokens_per_s, fixed_level, inflight...;
// the deadline is scored, the fetch is never cut short). static_levels
// (per chunk, -1 = recompute) replaces the planner (FetchSession). The
// client is warm: it knows this machine's decode times per level (the
// context's means) and their spread, not the link.
SimOutcome SimulateFetch(const SimContext& context, const SimLink& link, const DecodeTimes& decode,
                         const StreamOptions& options, const std::vector<int>& static_levels = {});

}  // namespace cachegen::sim
