#include "cachegen/planner.h"

#include <algorithm>
#include <limits>

namespace cachegen {

LevelPlanner::LevelPlanner(std::vector<PlanChunk> chunks, PlannerOptions options)
    : chunks_(std::move(chunks)), options_(options) {
  for (const PlanChunk& c : chunks_) levels_ = std::max(levels_, static_cast<int>(c.level_bytes.size()));
  if (options_.initial_bandwidth_bytes_s > 0) bandwidth_ = options_.initial_bandwidth_bytes_s;
  options_.smoothing = std::clamp(options_.smoothing, 0.01, 1.0);
  options_.safety = std::clamp(options_.safety, 0.01, 1.0);
}

void LevelPlanner::OnDelivered(uint64_t bytes, double seconds) {
  if (!(seconds > 0)) return;
  const double sample = static_cast<double>(bytes) / seconds;
  bandwidth_ = bandwidth_ > 0 ? options_.smoothing * sample + (1 - options_.smoothing) * bandwidth_ : sample;
}

void LevelPlanner::OnProcessed(double seconds) {
  if (!(seconds >= 0)) return;
  tail_s_ = have_tail_ ? options_.smoothing * seconds + (1 - options_.smoothing) * tail_s_ : seconds;
  have_tail_ = true;
}

int LevelPlanner::Resolve(uint32_t c, int level) const {
  const std::vector<uint64_t>& b = chunks_[c].level_bytes;
  const int n = static_cast<int>(b.size());
  level = std::clamp(level, 0, std::max(n - 1, 0));
  for (int l = level; l < n; ++l)
    if (b[l] > 0) return l;
  for (int l = level - 1; l >= 0; --l)
    if (b[l] > 0) return l;
  return -1;
}

int LevelPlanner::Coarsest(uint32_t c) const {
  const std::vector<uint64_t>& b = chunks_[c].level_bytes;
  for (int l = static_cast<int>(b.size()) - 1; l >= 0; --l)
    if (b[l] > 0) return l;
  return -1;
}

uint64_t LevelPlanner::Bytes(uint32_t c, int level) const {
  const int l = Resolve(c, level);
  return l < 0 ? 0 : chunks_[c].level_bytes[l];
}

Plan LevelPlanner::Replan(uint32_t first, double elapsed_s, uint64_t outstanding_bytes) const {
  Plan plan;
  const uint32_t n = static_cast<uint32_t>(chunks_.size());
  first = std::min(first, n);
  plan.first = first;
  plan.decisions.resize(n - first);
  auto decision = [&](uint32_t c) -> ChunkDecision& { return plan.decisions[c - first]; };

  if (bandwidth_ <= 0) {  // unknown: probe with the coarsest level
    for (uint32_t c = first; c < n; ++c) decision(c).level = Coarsest(c);
    return plan;
  }
  const double bw = bandwidth_ * options_.safety;
  const double left = options_.deadline_s - elapsed_s - tail_s_;
  const double rate = options_.recompute_tokens_per_s;
  auto expected = [&](uint64_t fetch_bytes, uint64_t recompute_tokens) {
    double t = static_cast<double>(outstanding_bytes + fetch_bytes) / bw + tail_s_;
    if (recompute_tokens > 0) t += rate > 0 ? static_cast<double>(recompute_tokens) / rate
                                            : std::numeric_limits<double>::infinity();
    return t;
  };

  // Chunks with no stored level can only be recomputed.
  uint64_t forced_tokens = 0;
  for (uint32_t c = first; c < n; ++c)
    if (Coarsest(c) < 0) forced_tokens += chunks_[c].tokens;
  const double forced_s = forced_tokens == 0 ? 0
                          : rate > 0         ? static_cast<double>(forced_tokens) / rate
                                             : std::numeric_limits<double>::infinity();

  // 1. The finest uniform level that fits, then upgrades one level finer.
  const double budget = (left - forced_s) * bw - static_cast<double>(outstanding_bytes);
  for (int L = 0; L < std::max(levels_, 1); ++L) {
    uint64_t total = 0;
    for (uint32_t c = first; c < n; ++c) total += Bytes(c, L);
    if (static_cast<double>(total) > budget) continue;
    double slack = budget - static_cast<double>(total);
    for (uint32_t c = first; c < n; ++c) {
      decision(c).level = Resolve(c, L);
      if (decision(c).level < 0) continue;
      if (L > 0) {
        const int finer = Resolve(c, L - 1);
        const double delta = static_cast<double>(Bytes(c, L - 1)) - static_cast<double>(Bytes(c, L));
        if (finer >= 0 && finer < decision(c).level && delta <= slack) {
          decision(c).level = finer;
          slack -= delta;
          total += static_cast<uint64_t>(delta);
        }
      }
    }
    plan.feasible = true;
    plan.expected_s = expected(total, forced_tokens);
    return plan;
  }

  // 2. Even the coarsest level is late: recompute, latest chunks first, where
  // recomputing is cheaper than fetching at the coarsest level.
  uint64_t fetch = 0, recompute = forced_tokens;
  for (uint32_t c = first; c < n; ++c) {
    decision(c).level = Coarsest(c);
    fetch += Bytes(c, decision(c).level);
  }
  auto fits = [&] { return expected(fetch, recompute) <= options_.deadline_s - elapsed_s; };
  if (rate > 0) {
    for (uint32_t c = n; c-- > first && !fits();) {
      if (decision(c).level < 0) continue;
      const double fetch_s = static_cast<double>(Bytes(c, decision(c).level)) / bw;
      const double recompute_s = static_cast<double>(chunks_[c].tokens) / rate;
      if (recompute_s < fetch_s) {
        fetch -= Bytes(c, decision(c).level);
        recompute += chunks_[c].tokens;
        decision(c).level = -1;
      }
    }
  }
  plan.feasible = fits();
  plan.expected_s = expected(fetch, recompute);
  if (plan.feasible) {  // spend the slack on one level finer, earliest first
    double slack = (options_.deadline_s - elapsed_s - plan.expected_s) * bw;
    for (uint32_t c = first; c < n; ++c) {
      const int l = decision(c).level;
      if (l <= 0) continue;
      const int finer = Resolve(c, l - 1);
      const double delta = static_cast<double>(Bytes(c, finer)) - static_cast<double>(Bytes(c, l));
      if (finer >= 0 && finer < l && delta <= slack) {
        decision(c).level = finer;
        slack -= delta;
        fetch += static_cast<uint64_t>(delta);
      }
    }
    plan.expected_s = expected(fetch, recompute);
  }
  return plan;
}

}  // namespace cachegen
