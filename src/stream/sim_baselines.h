// Internal: what the streaming simulation judges the client against
// (fetch_sim.h): the offline oracle, which knows the whole trial in advance,
// and the static policy published with CacheGen.
#pragma once

#include <vector>

#include "stream/fetch_sim.h"

namespace cachegen::sim {

// The best any policy could have done in a trial: the plan (a level per
// chunk, or recompute) of least ContextKl whose end meets the deadline,
// knowing the trial's whole future: the link's, and every decode's time
// (`decode`). So it meets every deadline any policy met. Its time model is the
// planner's (LevelPlanner): every frame requested at the start, back to
// back on the link (first byte a round trip later); chunks decoded one at a
// time in order, each once it arrived and the one before is decoded;
// recomputed chunks after both, at the recompute speed. Dynamic programming
// over chunks x (levels + recompute): states are (bytes so far, in bins of
// 1/256 of the level-0 total; recomputed tokens), each holding the plans
// that no other in it beats on bytes, decode end and KL (at most 8: the
// rest are dropped, so the optimum found is near-exact, not proven).
// Not met: the plan that ends first (every chunk at its coarsest level or
// recomputed where that is sooner).
SimOutcome Oracle(const SimContext& context, const SimLink& link, const DecodeTimes& decode, double deadline_s,
                  double recompute_tokens_per_s);

// The outcome of a plan (per chunk a level, or -1 = recompute) under the
// oracle's time model.
SimOutcome ScorePlan(const SimContext& context, const SimLink& link, const DecodeTimes& decode,
                     const std::vector<int>& levels, double deadline_s, double recompute_tokens_per_s);

// CacheGen's published streaming policy: each chunk gets deadline / n of
// the time; with the link's bandwidth known in advance (its mean), a chunk
// takes the finest level whose frame the link moves within that budget,
// else it is recomputed from its text (at the coarsest level when the engine
// cannot recompute). Per chunk: a level, or -1.
std::vector<int> PublishedPolicyLevels(const SimContext& context, double bandwidth_bytes_s, double deadline_s,
                                       double recompute_tokens_per_s);

}  // namespace cachegen::sim
