// The streaming simulation's baselines (sim_baselines.h).
#include "stream/sim_baselines.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_map>

namespace cachegen::sim {
namespace {

uint64_t PacketsOf(uint64_t bytes) { return (bytes + LinkTrace::kPacketBytes - 1) / LinkTrace::kPacketBytes; }

// A plan for the chunks so far (one DP label).
struct Label {
  uint64_t packets = 0;     // link opportunities its frames take
  double end_s = 0;         // its last decode's end
  double kl_tokens = 0;     // sum of tokens x the KL of each chunk's level
  uint64_t recompute = 0;   // tokens recomputed
  int32_t parent = -1;      // label of the chunks before, in the previous stage
  int8_t choice = -1;       // this stage's chunk: level, or -1 = recompute
};

bool Dominates(const Label& a, const Label& b) {
  return a.packets <= b.packets && a.end_s <= b.end_s && a.kl_tokens <= b.kl_tokens && a.recompute <= b.recompute;
}

}  // namespace

SimOutcome ScorePlan(const SimContext& context, const SimLink& sim_link, const DecodeTimes& decode,
                     const std::vector<int>& levels, double deadline_s, double recompute_tokens_per_s) {
  const LinkQueue link(sim_link.trace, sim_link.offset_s);
  const double rtt_s = sim_link.rtt_s;
  SimOutcome out;
  out.levels = levels;
  uint64_t packets = 0, recompute_tokens = 0;
  double end = 0, level_sum = 0;
  int delivered = 0;
  for (size_t c = 0; c < levels.size(); ++c) {
    const int l = levels[c];
    if (l < 0) {
      recompute_tokens += context.chunks[c].tokens;
      ++out.recomputed;
      continue;
    }
    const uint64_t bytes = context.chunks[c].level_bytes[l];
    packets += PacketsOf(bytes);
    out.bytes += bytes;
    end = std::max(end, link.ArrivalOfPackets(rtt_s, packets)) + decode[c][l];
    level_sum += l;
    ++delivered;
  }
  out.total_s = end + RecomputeSeconds(recompute_tokens, recompute_tokens_per_s);
  out.met = out.total_s <= deadline_s;
  out.kl = ContextKl(context, levels);
  out.level = delivered ? level_sum / delivered : 0;
  return out;
}

SimOutcome Oracle(const SimContext& context, const SimLink& link, const DecodeTimes& decode, double deadline_s,
                  double recompute_tokens_per_s) {
  const LinkQueue queue(link.trace, link.offset_s);
  const size_t n = context.chunks.size();
  uint64_t level0_packets = 0;  // every chunk at its finest level
  for (const PlanChunk& c : context.chunks) level0_packets += PacketsOf(c.level_bytes[c.finest()]);
  constexpr uint64_t kBins = 256;
  constexpr size_t kPerState = 8;
  const uint64_t bin = std::max<uint64_t>(1, level0_packets / kBins);

  std::vector<std::vector<Label>> stages(n + 1);
  stages[0].push_back(Label{});
  for (size_t c = 0; c < n; ++c) {
    const PlanChunk& chunk = context.chunks[c];
    std::unordered_map<uint64_t, std::vector<uint32_t>> states;
    std::vector<Label>& next = stages[c + 1];
    auto offer = [&](const Label& x) {
      if (x.end_s + RecomputeSeconds(x.recompute, recompute_tokens_per_s) > deadline_s) return;
      std::vector<uint32_t>& state = states[(x.packets / bin) << 32 | x.recompute];
      for (uint32_t i : state)
        if (Dominates(next[i], x)) return;
      std::erase_if(state, [&](uint32_t i) { return Dominates(x, next[i]); });
      if (state.size() >= kPerState) {  // full: the new plan replaces the worst in KL if it is better
        auto worst = std::max_element(state.begin(), state.end(),
                                      [&](uint32_t a, uint32_t b) { return next[a].kl_tokens < next[b].kl_tokens; });
        if (next[*worst].kl_tokens <= x.kl_tokens) return;
        state.erase(worst);
      }
      state.push_back(static_cast<uint32_t>(next.size()));
      next.push_back(x);
    };
    for (size_t p = 0; p < stages[c].size(); ++p) {
      const Label& from = stages[c][p];
      for (int l = 0; l < static_cast<int>(chunk.level_bytes.size()); ++l) {
        if (chunk.level_bytes[l] == 0) continue;
        Label x = from;
        x.packets += PacketsOf(chunk.level_bytes[l]);
        x.end_s = std::max(from.end_s, queue.ArrivalOfPackets(link.rtt_s, x.packets)) + decode[c][l];
        x.kl_tokens += chunk.tokens * context.level_kl[l];
        x.parent = static_cast<int32_t>(p);
        x.choice = static_cast<int8_t>(l);
        offer(x);
      }
      if (recompute_tokens_per_s > 0) {
        Label x = from;
        x.recompute += chunk.tokens;
        x.parent = static_cast<int32_t>(p);
        x.choice = -1;
        offer(x);
      }
    }
    // Labels dropped from a full state still sit in `next` unreferenced;
    // keep only those a state holds.
    std::vector<Label> kept;
    for (auto& [key, state] : states)
      for (uint32_t i : state) kept.push_back(next[i]);
    std::sort(kept.begin(), kept.end(), [](const Label& a, const Label& b) {
      return a.kl_tokens != b.kl_tokens ? a.kl_tokens < b.kl_tokens : a.end_s < b.end_s;
    });
    next = std::move(kept);
    if (next.empty()) break;
  }

  std::vector<int> levels(n, -1);
  if (!stages[n].empty()) {  // sorted: the first has the least KL
    int32_t at = 0;
    for (size_t c = n; c-- > 0;) {
      const Label& x = stages[c + 1][at];
      levels[c] = x.choice;
      at = x.parent;
    }
  } else {  // infeasible: the fastest plan, every chunk at its coarsest level or recomputed where sooner
    for (size_t c = 0; c < n; ++c) {
      levels[c] = context.chunks[c].coarsest();
      if (recompute_tokens_per_s > 0) {
        const double fetch_s =
            static_cast<double>(context.chunks[c].level_bytes[levels[c]]) / link.trace->mean_bytes_per_s();
        if (RecomputeSeconds(context.chunks[c].tokens, recompute_tokens_per_s) < std::max(fetch_s, decode[c][levels[c]]))
          levels[c] = -1;
      }
    }
  }
  return ScorePlan(context, link, decode, levels, deadline_s, recompute_tokens_per_s);
}

std::vector<int> PublishedPolicyLevels(const SimContext& context, double bandwidth_bytes_s, double deadline_s,
                                       double recompute_tokens_per_s) {
  const size_t n = context.chunks.size();
  std::vector<int> levels(n, -1);
  if (n == 0) return levels;
  const double budget_s = deadline_s / static_cast<double>(n);
  for (size_t c = 0; c < n; ++c) {
    const std::vector<uint64_t>& b = context.chunks[c].level_bytes;
    for (int l = 0; l < static_cast<int>(b.size()) && levels[c] < 0; ++l)
      if (b[l] > 0 && static_cast<double>(b[l]) / bandwidth_bytes_s <= budget_s) levels[c] = l;
    if (levels[c] < 0 && recompute_tokens_per_s <= 0) levels[c] = context.chunks[c].coarsest();
  }
  return levels;
}

}  // namespace cachegen::sim
