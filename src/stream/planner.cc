#include "stream/planner.h"

#include <algorithm>
#include <cmath>
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
  decode_seen_.assign(levels_, 0);
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

void LevelPlanner::SetBandwidth(double bytes_per_s) {
  if (bytes_per_s > 0) bandwidth_ = bytes_per_s;
}

void LevelPlanner::OnProcessed(double seconds, int level, uint32_t tokens) {
  if (!(seconds >= 0)) return;
  auto ewma = [&](double old, bool have) { return have ? options_.smoothing * seconds + (1 - options_.smoothing) * old : seconds; };
  tail_s_ = ewma(tail_s_, have_tail_);
  have_tail_ = true;
  if (level >= 0 && level < levels_) {
    // The spread: each time against its level's estimate before it (the
    // noise the plan meets), not against the mean of every level.
    if (decode_seen_[level] > 0) {
      const double r = seconds - decode_s_[level];
      decode_sq_residuals_ += r * r;
      ++decode_residuals_;
    }
    decode_s_[level] = ewma(decode_s_[level], decode_seen_[level] > 0);
    ++decode_seen_[level];
    decode_any_s_ = ewma(decode_any_s_, decode_samples_ > 0);
    ++decode_samples_;
    const double prior_s = PriorDecodeSeconds(level, tokens);
    if (prior_s > 0) {
      const double speed = seconds / prior_s;
      // The prior counts as one sample; a running mean, then an EWMA of
      // weight kSpeedSmoothing (planner.h, DecodeSeconds).
      ++prior_speed_samples_;
      const double w = std::max(1.0 / (prior_speed_samples_ + kTrustedSamples), kSpeedSmoothing);
      prior_speed_ = w * speed + (1 - w) * prior_speed_;
    }
  }
}

double LevelPlanner::PriorDecodeSeconds(int level, uint32_t tokens) const {
  const std::vector<double>& prior = options_.level_decode_s_per_token;
  if (level < 0 || static_cast<size_t>(level) >= prior.size() || !(prior[level] > 0)) return 0;
  return prior[level] * tokens;
}

void LevelPlanner::OnDecoderLoss(double wall_s, double cpu_s, uint64_t bytes) {
  if (bytes == 0 || !(cpu_s >= 0) || !(wall_s >= cpu_s)) return;
  decoder_lost_s_ += wall_s - cpu_s;
  decoder_loss_bytes_ += static_cast<double>(bytes);
  ++decoder_loss_samples_;
}

double LevelPlanner::ReceiveCost() const {
  if (!receive_cost_measured()) return std::max(options_.receive_cost_s_per_byte, 0.0);
  return decoder_lost_s_ / decoder_loss_bytes_;
}

double LevelPlanner::DecodeSeconds(uint32_t c, int level) const {
  const int l = Resolve(c, level);
  if (l < 0) return 0;
  // Where earlier fetches measured the levels, their times scaled by the
  // machine's speed now, which every decode of this fetch measures. Else a
  // level's own time, from kTrustedSamples on: one sample of a level is one
  // noisy decode on a loaded machine, and a level seen once or twice that
  // happened to decode fast would draw a decode-bound plan to it. Else the
  // nearest such level's (finer first), or the time of every level seen
  // (see planner.h).
  auto trusted = [&](int s) { return s >= 0 && s < levels_ && decode_seen_[s] >= kTrustedSamples; };
  if (const double prior_s = PriorDecodeSeconds(l, chunks_[c].tokens); prior_s > 0) return prior_speed_ * prior_s;
  if (trusted(l)) return decode_s_[l];
  for (int d = 1; d < levels_; ++d)
    for (int s : {l - d, l + d})
      if (trusted(s)) return decode_s_[s];
  if (decode_samples_ == 0) return std::max(options_.decode_s_per_token, 0.0) * chunks_[c].tokens;
  return decode_any_s_;
}

double LevelPlanner::DecodeCv() const {
  if (!decode_spread_measured()) return 0;
  return std::sqrt(decode_sq_residuals_ / decode_residuals_) / decode_any_s_;
}

PlanMargins LevelPlanner::Margins(size_t decodes_ahead, bool decode_bound) const {
  constexpr double kMaxSafety = 0.99;
  constexpr double kReserveFloor = 0.005;  // of the deadline
  const double z = std::max(options_.spread_sigmas, 0.0);
  const double configured_s = options_.reserve * options_.deadline_s;
  PlanMargins m{options_.safety, options_.safety, configured_s};
  if (!options_.measured_margins) return m;
  const bool link_known = link_.segments >= kTrustedSamples;
  // The decoder's spread: measured in this fetch, else an earlier fetch's
  // on this machine (PlannerOptions::decode_cv).
  const double cv = decode_spread_measured() ? DecodeCv() : std::max(options_.decode_cv, 0.0);
  const bool decode_known = decode_spread_measured() || cv > 0;
  const double hi = std::max(options_.safety, kMaxSafety);
  if (link_known) m.link_safety = std::clamp(1 - z * link_.rate_cv, options_.safety, hi);
  // The decodes ahead add up: their sum spreads sqrt(k) times less, relative
  // to it, than one decode does (planner.h).
  const double ahead = std::sqrt(static_cast<double>(std::max<size_t>(decodes_ahead, 1)));
  if (decode_known) m.decode_safety = std::clamp(1 - z * cv / ahead, options_.safety, hi);
  const double one_decode_s = decode_any_s_ > 0 ? decode_any_s_ : (chunks_.empty() ? 0 : DecodeSeconds(0, 0));
  m.decodes_sd_s = cv * one_decode_s * ahead;
  // A decode-bound fetch ends with the decoder whatever the link's noise.
  if (decode_known && (link_known || decode_bound)) {
    const double decode_sd = cv * one_decode_s;
    const double link_sd = link_known ? link_.time_sd_s : 0;
    const double measured = z * std::sqrt(link_sd * link_sd + decode_sd * decode_sd) + kReserveFloor * options_.deadline_s;
    m.reserve_s = std::min(measured, configured_s);
  }
  return m;
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

int PlanChunk::finest() const {
  for (int l = 0; l < static_cast<int>(level_bytes.size()); ++l)
    if (level_bytes[l] > 0) return l;
  return -1;
}

int PlanChunk::coarsest() const {
  for (int l = static_cast<int>(level_bytes.size()) - 1; l >= 0; --l)
    if (level_bytes[l] > 0) return l;
  return -1;
}

int LevelPlanner::Coarsest(uint32_t c) const { return chunks_[c].coarsest(); }

uint64_t LevelPlanner::Bytes(uint32_t c, int level) const {
  const int l = Resolve(c, level);
  return l < 0 ? 0 : chunks_[c].level_bytes[l];
}

// One chunk still to plan: not requested yet (cur < 0), or in flight at
// level cur with `left` bytes still to come.
// A backup (level >= 0) may stand in for it at no further link time.
struct LevelPlanner::Slot {
  uint32_t c = 0;
  int cur = -1;
  uint64_t left = 0;
  int backup = -1;
};

Plan LevelPlanner::Replan(uint32_t first, double elapsed_s, uint64_t outstanding_bytes,
                          double pending_decode_s) const {
  return Solve(first, elapsed_s, outstanding_bytes, {}, std::vector<int>(chunks_.size(), -1), 0, pending_decode_s);
}

Plan LevelPlanner::Replan(uint32_t first, double elapsed_s, std::span<const InFlight> inflight,
                          double pending_decode_s) const {
  return Replan(first, elapsed_s, inflight, {}, pending_decode_s);
}

Plan LevelPlanner::Replan(uint32_t first, double elapsed_s, std::span<const InFlight> inflight,
                          std::span<const InFlight> backups, double pending_decode_s) const {
  std::vector<int> backup(chunks_.size(), -1);
  uint64_t to_come = 0;
  for (const InFlight& b : backups) {
    if (b.chunk >= chunks_.size() || b.level < 0 || b.level >= levels_ || backup[b.chunk] >= 0) continue;
    const uint64_t size = FrameBytes(b.chunk, b.level);
    if (size == 0) continue;
    backup[b.chunk] = b.level;
    to_come += size > b.received ? size - b.received : 0;
  }
  return Solve(first, elapsed_s, to_come, inflight, backup, BackupTotal(backups), pending_decode_s);
}

uint64_t LevelPlanner::FrameBytes(uint32_t c, int level) const {
  const std::vector<uint64_t>& b = chunks_[c].level_bytes;
  return level >= 0 && level < static_cast<int>(b.size()) ? b[level] : 0;
}

uint64_t LevelPlanner::BackupTotal(std::span<const InFlight> backups) const {
  uint64_t total = 0;
  for (const InFlight& b : backups)
    if (b.chunk < chunks_.size()) total += FrameBytes(b.chunk, b.level);
  return total;
}

Plan LevelPlanner::Solve(uint32_t first, double elapsed_s, uint64_t kept_bytes, std::span<const InFlight> inflight,
                         const std::vector<int>& backup, uint64_t backup_total, double pending_decode_s) const {
  Plan plan;
  const uint32_t n = static_cast<uint32_t>(chunks_.size());
  first = std::min(first, n);
  plan.first = first;
  plan.decisions.resize(n - first);
  plan.reissue.assign(inflight.size(), -1);

  // Re-issuing costs the bytes received and the old request's next burst:
  // only when keeping every request in flight makes the deadline infeasible.
  if (!inflight.empty() && bandwidth_ > 0) {
    uint64_t kept = kept_bytes;
    double kept_decode = pending_decode_s;
    for (const InFlight& f : inflight) {
      if (f.chunk >= n || f.level < 0 || f.level >= levels_) continue;
      const uint64_t bytes = Bytes(f.chunk, f.level);
      kept += bytes > f.received ? bytes - f.received : 0;
      kept_decode += DecodeSeconds(f.chunk, f.level);
    }
    // Feasible within the whole deadline, reserve included: the reserve is
    // the margin for the estimate's swings, and a plan that spent its slack
    // on upgrades turns "infeasible" at the smallest one.
    const double reserve_s = Margins().reserve_s;
    if (Solve(first, elapsed_s - reserve_s, kept, {}, backup, backup_total, kept_decode).feasible) {
      Plan keep = Solve(first, elapsed_s, kept, {}, backup, backup_total, kept_decode);
      keep.reissue.assign(inflight.size(), -1);
      return keep;
    }
  }

  std::vector<Slot> slots;
  for (const InFlight& f : inflight) {
    if (f.chunk >= n || f.level < 0 || f.level >= levels_) continue;
    const uint64_t bytes = FrameBytes(f.chunk, f.level);
    slots.push_back({f.chunk, f.level, bytes > f.received ? bytes - f.received : 0, backup[f.chunk]});
  }
  const size_t n_inflight = slots.size();
  for (uint32_t c = first; c < n; ++c) slots.push_back({c, -1, 0, backup[c]});
  std::vector<int> level(slots.size(), -1);
  auto finish = [&] {
    for (size_t i = 0, k = 0; i < inflight.size(); ++i) {
      const InFlight& f = inflight[i];
      if (f.chunk >= n || f.level < 0 || f.level >= levels_) continue;
      if (level[k] != f.level) plan.reissue[i] = level[k];
      ++k;
    }
    for (size_t k = n_inflight; k < slots.size(); ++k) plan.decisions[slots[k].c - first].level = level[k];
    return plan;
  };

  // While the link's rate is unknown the plan is the decoder's alone (the
  // link taken as free): the probe is at the finest level the decoder
  // leaves in time (see planner.h).
  const bool link_known = bandwidth_ > 0;
  const double link_bytes_s = link_known ? bandwidth_ : kFreeLinkBytesPerS;
  const double inf = std::numeric_limits<double>::infinity();
  // Decode-bound whatever the plan: every slot at its finest level still
  // crosses the link in under half the decode time at the coarsest.
  double finest_bytes = static_cast<double>(kept_bytes), coarsest_decode_s = pending_decode_s;
  for (const Slot& s : slots) {
    finest_bytes += static_cast<double>(s.cur >= 0 ? s.left : Bytes(s.c, 0));
    const int coarsest = s.cur >= 0 ? s.cur : Coarsest(s.c);
    if (coarsest >= 0) coarsest_decode_s += DecodeSeconds(s.c, coarsest);
  }
  const bool decode_bound = finest_bytes / link_bytes_s + tail_s_ < 0.5 * coarsest_decode_s;
  const PlanMargins margins = Margins(slots.size(), decode_bound);
  // The plan derates each stage by half its margin; the escape keeps the
  // whole margin for the tail (planner.h).
  const double bw = link_bytes_s * (1 + margins.link_safety) / 2;
  const double dsafety = (1 + margins.decode_safety) / 2;
  const double left = options_.deadline_s - margins.reserve_s - elapsed_s;
  const double rate = options_.recompute_tokens_per_s;
  auto recompute_s = [&](uint64_t tokens) {
    return tokens == 0 ? 0.0 : rate > 0 ? static_cast<double>(tokens) / rate : inf;
  };
  // Decoder time lost to receiving a byte (planner.h, "Receiving shares the
  // CPU"); a slot's decode time below counts its bytes' share.
  const double lost_per_byte = ReceiveCost();
  // Decoder time already committed: the decodes pending and what the bytes
  // still to come of requests in flight cost it.
  const double committed_decode_s = pending_decode_s + lost_per_byte * static_cast<double>(kept_bytes);
  // Two stages in a row: the link, then the decoder (one chunk at a time).
  auto expected = [&](uint64_t fetch_bytes, double decode_s, uint64_t recompute_tokens) {
    const double transfer = static_cast<double>(kept_bytes + fetch_bytes) / bw + tail_s_;
    const double decode = (committed_decode_s + decode_s) / dsafety;
    return std::max(transfer, decode) + recompute_s(recompute_tokens);
  };

  // A request in flight is re-issued at a coarser level only when that
  // level's frame is clearly smaller than what is still to come: a new
  // request also pays a round trip, and the old one's next burst.
  constexpr double kReissueGain = 0.9;
  auto reissuable = [&](const Slot& s, int l) {
    return l < static_cast<int>(chunks_[s.c].level_bytes.size()) && chunks_[s.c].level_bytes[l] > 0 &&
           static_cast<double>(chunks_[s.c].level_bytes[l]) < kReissueGain * static_cast<double>(s.left);
  };
  // Level of slot s in a plan at uniform level L (-1: recompute); a backup
  // stands in for its level and every coarser one.
  auto level_at = [&](const Slot& s, int L) {
    const int l = Resolve(s.c, L);
    if (s.backup >= 0 && l >= s.backup) return s.backup;
    if (s.cur < 0) return l;
    return l > s.cur && reissuable(s, l) ? l : s.cur;
  };
  auto bytes_at = [&](const Slot& s, int l) -> uint64_t {
    if (l < 0 || l == s.backup) return 0;  // a backup's bytes are in kept_bytes
    return l == s.cur ? s.left : Bytes(s.c, l);
  };
  auto decode_at = [&](const Slot& s, int l) {
    return l < 0 ? 0.0 : DecodeSeconds(s.c, l) + lost_per_byte * static_cast<double>(bytes_at(s, l));
  };
  // The next finer level of slot s from l; -1 if none.
  auto finer = [&](const Slot& s, int l) {
    if (l <= 0) return -1;
    if (s.cur < 0) {
      const int f = Resolve(s.c, l - 1);
      return f >= 0 && f < l ? f : -1;
    }
    if (l <= s.cur) return -1;
    for (int k = l - 1; k > s.cur; --k)
      if (reissuable(s, k)) return k;
    return s.cur;
  };

  // Chunks with no stored level can only be recomputed.
  uint64_t forced_tokens = 0;
  for (const Slot& s : slots)
    if (s.cur < 0 && Coarsest(s.c) < 0) forced_tokens += chunks_[s.c].tokens;
  const double forced_s = recompute_s(forced_tokens);

  // 1. The finest uniform level that fits both stages, then upgrades one
  // level finer, earliest chunks first, while both still fit.
  const double byte_budget = (left - forced_s - tail_s_) * bw - static_cast<double>(kept_bytes);
  const double decode_budget = (left - forced_s) * dsafety - committed_decode_s;
  auto upgrade = [&](double byte_slack, double decode_slack, uint64_t* total, double* decode) {
    for (size_t k = 0; k < slots.size(); ++k) {
      if (level[k] < 0) continue;
      const int f = finer(slots[k], level[k]);
      if (f < 0) continue;
      const double db =
          static_cast<double>(bytes_at(slots[k], f)) - static_cast<double>(bytes_at(slots[k], level[k]));
      const double dd = decode_at(slots[k], f) - decode_at(slots[k], level[k]);
      if (db <= byte_slack && dd <= decode_slack) {
        byte_slack -= db;
        decode_slack -= dd;
        *total = static_cast<uint64_t>(static_cast<double>(*total) + db);
        *decode += dd;
        level[k] = f;
      }
    }
  };
  const int coarsest_uniform = std::max(levels_, 1) - 1;
  // Escape (planner.h): the chunk requested now is made coarser, a level
  // at a time, until both stages, with every later chunk at its coarsest,
  // still end in the time left at their whole margins.
  auto escape = [&](uint64_t* total, double* decode) {
    const size_t k0 = n_inflight;
    if (k0 >= slots.size() || level[k0] < 0) return;
    const Slot& s0 = slots[k0];
    double rest_bytes = static_cast<double>(kept_bytes), rest_s = committed_decode_s;
    for (size_t k = 0; k < slots.size(); ++k) {
      if (k == k0 || level[k] < 0) continue;
      const int l = level_at(slots[k], coarsest_uniform);
      rest_bytes += static_cast<double>(bytes_at(slots[k], l));
      rest_s += decode_at(slots[k], l);
    }
    const double link_escape_bytes_s = link_bytes_s * margins.link_safety;
    const double z = std::max(options_.spread_sigmas, 0.0);
    auto late = [&](int l) {
      const double link_s = (rest_bytes + static_cast<double>(bytes_at(s0, l))) / link_escape_bytes_s + tail_s_;
      const double decode_s = rest_s + decode_at(s0, l) + z * margins.decodes_sd_s;
      return std::max(link_s, decode_s) > left - forced_s;
    };
    while (late(level[k0])) {
      const int coarser = level_at(s0, level[k0] + 1);
      if (coarser <= level[k0]) break;
      *total = *total - bytes_at(s0, level[k0]) + bytes_at(s0, coarser);
      *decode += decode_at(s0, coarser) - decode_at(s0, level[k0]);
      level[k0] = coarser;
    }
  };
  // Uniform level L: bytes and decode time of every slot.
  auto uniform = [&](int L, uint64_t* total, double* decode) {
    *total = 0;
    *decode = 0;
    for (size_t k = 0; k < slots.size(); ++k) {
      if (level[k] == -2) continue;  // recompute (phase 2)
      const int l = level_at(slots[k], L);
      *total += bytes_at(slots[k], l);
      *decode += decode_at(slots[k], l);
    }
  };
  auto apply = [&](int L) {
    for (size_t k = 0; k < slots.size(); ++k)
      if (level[k] != -2) level[k] = level_at(slots[k], L);
  };
  for (int L = 0; L <= coarsest_uniform; ++L) {
    uint64_t total = 0;
    double decode = 0;
    uniform(L, &total, &decode);
    if (static_cast<double>(total) > byte_budget || decode > decode_budget) continue;
    apply(L);
    if (L > 0) upgrade(byte_budget - static_cast<double>(total), decode_budget - decode, &total, &decode);
    escape(&total, &decode);
    plan.feasible = true;
    plan.expected_s = expected(total, decode, forced_tokens);
    // Hedging (planner.h): backups of the coarsest level for the latest
    // chunks not requested yet and planned finer, while the spare time is at
    // least 3 x the new backup's link time + 2 x every backup's so far. The
    // spare before any backup was spare + backups so far (each took its time
    // from it): so all backups together stay within a third of it, the rest
    // is left to the estimate's noise. The spare is the smaller of the two
    // stages': a backup also delays the decoder's next chunk by its link
    // time.
    double spare_s = std::min((byte_budget - static_cast<double>(total)) / bw, (decode_budget - decode) / dsafety);
    double backups_s = static_cast<double>(backup_total) / bw;
    // Only while a drop to 1/hedge_drop of the estimate (not derated: the
    // factor is the margin here), now, would make the deadline unreachable
    // even at the coarsest levels (what is still to come of backups and
    // requests in flight included, and what the fallen link carries before
    // the client acts on the fall): the insurance bought is what the
    // deadline needs, not what the slack allows.
    double coarse = static_cast<double>(kept_bytes + options_.hedge_react_bytes);
    for (const Slot& s : slots) {
      const int b = Coarsest(s.c);
      if (s.cur >= 0)
        coarse += static_cast<double>(std::min<uint64_t>(s.left, b >= 0 ? FrameBytes(s.c, b) : s.left));
      else if (s.backup < 0 && b >= 0)
        coarse += static_cast<double>(FrameBytes(s.c, b));
    }
    // Not while the decoder is the slower stage: there a backup's cost is
    // mostly the client's CPU (one more request to receive), which the
    // plan does not model (measured at 10 Gbit/s: 1-2 backups per fetch,
    // and the median later than the client without them).
    const bool link_bound = static_cast<double>(kept_bytes + total) / bw + tail_s_ >=
                            (committed_decode_s + decode) / dsafety;
    const bool exposed = options_.hedge && options_.hedge_drop > 1 && link_known && link_bound &&
                         coarse / (bandwidth_ / options_.hedge_drop) + tail_s_ > left - forced_s;
    for (size_t k = slots.size(); exposed && k-- > n_inflight;) {
      const Slot& s = slots[k];
      const int b = Coarsest(s.c);
      if (s.backup >= 0 || level[k] < 0 || b < 0 || level[k] >= b) continue;
      const double link_s = static_cast<double>(FrameBytes(s.c, b)) / bw;
      if (3 * link_s + 2 * backups_s > spare_s) break;
      plan.hedge.push_back(s.c);
      spare_s -= link_s;
      backups_s += link_s;
    }
    return finish();
  }

  // 2. Even the coarsest level is late: recompute, latest chunks first, where
  // recomputing is cheaper than fetching at the coarsest level.
  uint64_t fetch = 0, recompute = forced_tokens;
  double decode = 0;
  apply(coarsest_uniform);
  uniform(coarsest_uniform, &fetch, &decode);
  auto fits = [&] { return expected(fetch, decode, recompute) <= left; };
  if (rate > 0) {
    for (size_t k = slots.size(); k-- > n_inflight && !fits();) {
      if (level[k] < 0) continue;
      const Slot& s = slots[k];
      const double fetch_s = std::max(static_cast<double>(bytes_at(s, level[k])) / bw, decode_at(s, level[k]));
      if (static_cast<double>(chunks_[s.c].tokens) / rate < fetch_s) {
        fetch -= bytes_at(s, level[k]);
        decode -= decode_at(s, level[k]);
        recompute += chunks_[s.c].tokens;
        level[k] = -2;
      }
    }
  }
  plan.feasible = fits();
  plan.expected_s = expected(fetch, decode, recompute);
  if (plan.feasible) {  // spend the slack on one level finer, earliest first
    const double spare = left - plan.expected_s;
    upgrade(spare * bw, spare * dsafety, &fetch, &decode);
    plan.expected_s = expected(fetch, decode, recompute);
  } else {
    // Late anyway: the finest uniform level expected to end (about) as early
    // as the coarsest. A decode-bound transfer ends no sooner at coarser
    // levels when they decode as slowly, and a few ms of lateness are not
    // worth a level.
    const double tolerance = 0.01 * options_.deadline_s;
    for (int L = 0; L < coarsest_uniform; ++L) {
      uint64_t f = 0;
      double d = 0;
      uniform(L, &f, &d);
      if (expected(f, d, recompute) <= plan.expected_s + tolerance) {
        apply(L);
        plan.expected_s = expected(f, d, recompute);
        break;
      }
    }
  }
  for (int& l : level)
    if (l == -2) l = -1;
  return finish();
}

void RateEstimator::Observe(double busy_s, uint64_t total_bytes) {
  if (busy_s < history_.back().first || total_bytes < history_.back().second) return;
  // A silent stretch (nothing arrived) keeps only its first and newest
  // points: the newest makes the windows see the silence.
  if (history_.size() >= 2 && history_[history_.size() - 2].second == total_bytes &&
      history_.back().second == total_bytes)
    history_.back().first = busy_s;
  else
    history_.emplace_back(busy_s, total_bytes);
  if (busy_s - segment_start_.first >= options_.long_s && total_bytes - segment_start_.second >= options_.long_bytes) {
    segments_.emplace_back(busy_s - segment_start_.first, total_bytes - segment_start_.second);
    segment_start_ = {busy_s, total_bytes};
  }

  size_t short_start = 0;
  const double short_rate = WindowRate(options_.short_bytes, options_.short_s, &short_start);
  if (short_rate > 0 && rate_ > 0 && short_rate < options_.drop_ratio * rate_) {
    rate_ = short_rate;
    ++drops_;
    regime_ = segment_start_ = history_[short_start];
    segments_.clear();
    history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(short_start));
    return;
  }
  size_t long_start = 0;
  const double long_rate = WindowRate(options_.long_bytes, options_.long_s, &long_start);
  if (long_rate > 0) {
    rate_ = long_rate;
    // Nothing older than the long window is needed again.
    history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(long_start));
  } else if (short_rate > 0) {
    rate_ = short_rate;
  }
}

void RateEstimator::ObserveCompletion(double busy_s, uint64_t total_bytes) {
  Observe(busy_s, total_bytes);
  if (rate_ > 0) return;
  const auto& [t0, b0] = history_.front();
  if (busy_s - t0 >= options_.completion_s && total_bytes - b0 >= options_.short_bytes)
    rate_ = static_cast<double>(total_bytes - b0) / (busy_s - t0);
}

bool RateEstimator::settled() const {
  if (rate_ <= 0) return false;
  const auto& [t, b] = history_.back();
  return t - regime_.first >= 2 * options_.short_s && b - regime_.second >= options_.short_bytes;
}

LinkSpread RateEstimator::spread() const {
  LinkSpread s;
  s.segments = static_cast<int>(segments_.size());
  if (segments_.empty()) return s;
  double seconds = 0, bytes = 0;
  for (const auto& [t, b] : segments_) seconds += t, bytes += static_cast<double>(b);
  const double mean_rate = bytes / seconds;
  double rate_sq = 0, time_sq = 0;
  for (const auto& [t, b] : segments_) {
    const double r = static_cast<double>(b) / t - mean_rate;
    const double dt = t - static_cast<double>(b) / mean_rate;
    rate_sq += r * r;
    time_sq += dt * dt;
  }
  const double dof = std::max(s.segments - 1, 1);  // the mean is estimated from them too
  s.rate_cv = std::sqrt(rate_sq / dof) / mean_rate;
  s.time_sd_s = std::sqrt(time_sq / dof);
  return s;
}

double RateEstimator::WindowRate(uint64_t bytes, double seconds, size_t* start) const {
  if (history_.size() < 2) return 0;
  const auto& [t1, b1] = history_.back();
  // A shaped link delivers in bursts, and the client observes between them
  // too, so totals stand still for a while (plateaus). The window runs from
  // where its first total arrived (the plateau's first point) to where the
  // newest one did: a window that began at a plateau's last point would
  // count one burst more than the time it spans (+1/k for a window of k
  // bursts: +6.7 % at 0.1 Gbit/s), and one that ended at the newest tick
  // one burst interval more than its bytes (-1/(k+1)). The silence since the
  // newest arrival counts where it is longer than the window's mean interval
  // between arrivals: a link that stops delivering reads as a drop.
  auto plateau_start = [&](size_t k) {  // where point k's total first arrived
    while (k > 0 && history_[k - 1].second == history_[k].second) --k;
    return k;
  };
  const size_t newest = plateau_start(history_.size() - 1);
  const double arrived = history_[newest].first;
  for (size_t i = history_.size() - 1; i-- > 0;) {
    if (b1 - history_[i].second < bytes || t1 - history_[i].first < seconds || !(t1 > history_[i].first)) continue;
    i = plateau_start(i);
    const auto& [t0, b0] = history_[i];
    int arrivals = 0;
    for (size_t j = i + 1; j <= newest; ++j) arrivals += history_[j].second > history_[j - 1].second;
    const double interval = arrivals > 0 ? (arrived - t0) / arrivals : 0;
    const double end = std::max(arrived, t1 - interval);
    if (!(end > t0)) return 0;
    *start = i;
    return static_cast<double>(b1 - b0) / (end - t0);
  }
  return 0;
}

}  // namespace cachegen
