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
  options_.reserve = std::clamp(options_.reserve, 0.0, 0.5);
  decode_s_.assign(levels_, 0);
  decode_seen_.assign(levels_, false);
  level_total_.assign(levels_, 0);
  for (uint32_t c = 0; c < chunks_.size(); ++c)
    for (int l = 0; l < levels_; ++l) level_total_[l] += static_cast<double>(Bytes(c, l));
}

void LevelPlanner::OnDelivered(uint64_t bytes, double seconds) {
  if (!(seconds > 0)) return;
  const double sample = static_cast<double>(bytes) / seconds;
  // Down at once, up smoothed: a drop strands whatever is requested next.
  bandwidth_ = bandwidth_ > 0 && sample > bandwidth_
                   ? options_.smoothing * sample + (1 - options_.smoothing) * bandwidth_
                   : sample;
}

void LevelPlanner::OnProcessed(double seconds, int level) {
  if (!(seconds >= 0)) return;
  auto ewma = [&](double old, bool have) { return have ? options_.smoothing * seconds + (1 - options_.smoothing) * old : seconds; };
  tail_s_ = ewma(tail_s_, have_tail_);
  have_tail_ = true;
  if (level >= 0 && level < levels_) {
    decode_s_[level] = ewma(decode_s_[level], decode_seen_[level]);
    decode_seen_[level] = true;
  }
}

double LevelPlanner::DecodeSeconds(uint32_t c, int level) const {
  const int l = Resolve(c, level);
  if (l < 0) return 0;
  if (decode_seen_[l]) return decode_s_[l];
  // Not seen yet: scale the nearest level seen by the bytes per level.
  for (int d = 1; d < levels_; ++d)
    for (int s : {l - d, l + d})
      if (s >= 0 && s < levels_ && decode_seen_[s] && level_total_[s] > 0)
        return decode_s_[s] * level_total_[l] / level_total_[s];
  return 0;
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

Plan LevelPlanner::Replan(uint32_t first, double elapsed_s, uint64_t outstanding_bytes,
                          double pending_decode_s) const {
  Plan plan;
  const uint32_t n = static_cast<uint32_t>(chunks_.size());
  first = std::min(first, n);
  plan.first = first;
  plan.decisions.resize(n - first);
  auto decision = [&](uint32_t c) -> ChunkDecision& { return plan.decisions[c - first]; };

  if (bandwidth_ <= 0) {  // unknown: probe at the finest level (see planner.h)
    for (uint32_t c = first; c < n; ++c) decision(c).level = Resolve(c, 0);
    return plan;
  }
  const double inf = std::numeric_limits<double>::infinity();
  const double bw = bandwidth_ * options_.safety;
  const double left = options_.deadline_s * (1 - options_.reserve) - elapsed_s;
  const double rate = options_.recompute_tokens_per_s;
  auto recompute_s = [&](uint64_t tokens) {
    return tokens == 0 ? 0.0 : rate > 0 ? static_cast<double>(tokens) / rate : inf;
  };
  // Two stages in a row: the link, then the decoder (one chunk at a time).
  auto expected = [&](uint64_t fetch_bytes, double decode_s, uint64_t recompute_tokens) {
    const double transfer = static_cast<double>(outstanding_bytes + fetch_bytes) / bw + tail_s_;
    const double decode = (pending_decode_s + decode_s) / options_.safety;
    return std::max(transfer, decode) + recompute_s(recompute_tokens);
  };

  // Chunks with no stored level can only be recomputed.
  uint64_t forced_tokens = 0;
  for (uint32_t c = first; c < n; ++c)
    if (Coarsest(c) < 0) forced_tokens += chunks_[c].tokens;
  const double forced_s = recompute_s(forced_tokens);

  // 1. The finest uniform level that fits both stages, then upgrades one
  // level finer, earliest chunks first, while both still fit.
  const double byte_budget = (left - forced_s - tail_s_) * bw - static_cast<double>(outstanding_bytes);
  const double decode_budget = (left - forced_s) * options_.safety - pending_decode_s;
  auto upgrade = [&](double byte_slack, double decode_slack, uint64_t* total, double* decode) {
    for (uint32_t c = first; c < n; ++c) {
      const int l = decision(c).level;
      if (l <= 0) continue;
      const int finer = Resolve(c, l - 1);
      if (finer < 0 || finer >= l) continue;
      const double db = static_cast<double>(Bytes(c, finer)) - static_cast<double>(Bytes(c, l));
      const double dd = DecodeSeconds(c, finer) - DecodeSeconds(c, l);
      if (db <= byte_slack && dd <= decode_slack) {
        decision(c).level = finer;
        byte_slack -= db;
        decode_slack -= dd;
        *total += static_cast<uint64_t>(db);
        *decode += dd;
      }
    }
  };
  for (int L = 0; L < std::max(levels_, 1); ++L) {
    uint64_t total = 0;
    double decode = 0;
    for (uint32_t c = first; c < n; ++c) {
      total += Bytes(c, L);
      decode += DecodeSeconds(c, L);
    }
    if (static_cast<double>(total) > byte_budget || decode > decode_budget) continue;
    for (uint32_t c = first; c < n; ++c) decision(c).level = Resolve(c, L);
    if (L > 0) upgrade(byte_budget - static_cast<double>(total), decode_budget - decode, &total, &decode);
    plan.feasible = true;
    plan.expected_s = expected(total, decode, forced_tokens);
    return plan;
  }

  // 2. Even the coarsest level is late: recompute, latest chunks first, where
  // recomputing is cheaper than fetching at the coarsest level.
  uint64_t fetch = 0, recompute = forced_tokens;
  double decode = 0;
  for (uint32_t c = first; c < n; ++c) {
    decision(c).level = Coarsest(c);
    fetch += Bytes(c, decision(c).level);
    decode += DecodeSeconds(c, decision(c).level);
  }
  auto fits = [&] { return expected(fetch, decode, recompute) <= left; };
  if (rate > 0) {
    for (uint32_t c = n; c-- > first && !fits();) {
      if (decision(c).level < 0) continue;
      const double fetch_s = std::max(static_cast<double>(Bytes(c, decision(c).level)) / bw,
                                      DecodeSeconds(c, decision(c).level));
      if (static_cast<double>(chunks_[c].tokens) / rate < fetch_s) {
        fetch -= Bytes(c, decision(c).level);
        decode -= DecodeSeconds(c, decision(c).level);
        recompute += chunks_[c].tokens;
        decision(c).level = -1;
      }
    }
  }
  plan.feasible = fits();
  plan.expected_s = expected(fetch, decode, recompute);
  if (plan.feasible) {  // spend the slack on one level finer, earliest first
    const double spare = left - plan.expected_s;
    upgrade(spare * bw, spare * options_.safety, &fetch, &decode);
    plan.expected_s = expected(fetch, decode, recompute);
  }
  return plan;
}

}  // namespace cachegen
