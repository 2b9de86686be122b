// Deadline-aware quality-level planning for streaming a context's chunks.
//
// Pure logic (no I/O, no clocks): the caller reports what was delivered and
// how much time has passed; the planner answers, for every chunk not yet
// requested, which level to fetch or whether to recompute it from its text.
//
// Model. Chunks are fetched in order over one link of estimated bandwidth B
// (bytes/s: SetBandwidth from a RateEstimator, or OnDelivered samples "down
// at once, up smoothed"), then decoded one at a time (a
// second stage, overlapping the first); recomputing a chunk of n tokens costs
// n / R seconds (R = the engine's recompute speed, tokens/s, supplied by the
// caller; 0 = the engine cannot recompute), counted after both (a
// conservative bound). With time left `left`, the plan for the remaining
// chunks must satisfy
//     max((outstanding bytes + planned bytes) / B + tail,
//         pending decode + planned decode) + recompute tokens / R <= left
// where tail is the time to process the last chunk after it arrived, and
// decode times per level are learned from the chunks processed so far (and
// from earlier fetches' per level, scaled to this fetch's: DecodeSeconds).
// (B and the decode stage are both derated by `safety`.)
// Receiving shares the CPU with the decoder: where the machine has no core
// to spare (measured on a 2-core VM at 10 Gbit/s over loopback HTTP: the
// decoder lost a third of its time while the link was busy), every byte
// still to come delays the decoder too. So the decode stage counts, besides
// the decodes, k x (bytes to come), where k is the decoder time lost per
// byte received (OnDecoderLoss: the decoder's wall time not spent on its own
// CPU, over the bytes that arrived meanwhile; `receive_cost_s_per_byte`
// before it is measured). A decode time is the decoder's own CPU time then,
// so the loss is not counted twice. Coarser levels then end sooner when the
// decoder is the slower stage: they carry fewer bytes. On a slow link, k x
// bytes stays well below the bytes' link time, and the plan is unchanged.
// Among the plans that fit, it picks the best quality: the finest level L such
// that every remaining chunk fits at L, then it upgrades as many chunks as the
// slacks allow to the next finer level, earliest chunks first. So it never
// chooses a coarser level than the best fixed level that fits. When even the
// coarsest level does not fit, chunks whose recompute is cheaper than their
// coarsest fetch are moved to recompute (latest chunks first: they are the
// ones that would arrive late) until the rest fits; if nothing makes the
// deadline, the plan minimises the time (recompute where cheaper; among the
// levels, the finest one that is expected to end as early as the coarsest: a
// decode-bound transfer gains nothing from coarser chunks when they decode no
// faster) and reports feasible = false.
//
// Escape. A plan derates each stage by half its margin (Margins: the
// link's and the decoder's), and the chunk requested now is made coarser,
// a level at a time, until both stages, with every later chunk at its
// coarsest, still end in the time left at their whole margins (the link at
// its whole derating, the decoder z standard deviations of the sum of the
// decodes ahead before it). The plan is made again after every chunk, so
// the tail is where the whole margin is needed: a later chunk can still be
// coarser than planned. The whole margin on every plan cost a level on
// deadlines a few ms above the level-0 decode time (docs/results/service.md).
//
// Requests in flight. A request issued at a level chosen for the old rate can
// strand the transfer when the rate falls (a chunk requested at 1 Gbit/s takes
// 10x longer at 0.1). Replan with the requests in flight (InFlight: level and
// bytes received so far) also decides, per request, whether to abandon it and
// request the chunk again at a coarser level: it plans the in-flight chunks
// with the rest, where keeping a request costs the bytes still to come and
// re-requesting costs the new level's whole frame (only offered when that is
// clearly less). Only when keeping every request in flight makes the
// deadline infeasible (the whole deadline: the reserve is the margin for
// the estimate's swings): abandoning one also wastes its received bytes and
// the link time of its next burst, so small swings must not trigger it.
//
// Hedging. Re-issuing cannot save a transfer whose rate falls after most of
// its bytes went to fine early chunks: what is left needs more time than the
// deadline leaves even at the coarsest level (1 -> 0.1 Gbit/s after 40 % of
// level 0's bytes). So while a fall of the link to 1/hedge_drop of its
// estimate, now, would leave the deadline out of reach even at the coarsest
// levels (after the bytes the fallen link carries before the client can
// act on the fall, hedge_react_bytes), the link is the slower stage (on a
// decode-bound transfer a backup costs mostly client CPU, which the model
// does not count), and the best plan still leaves slack, the plan names
// chunks (latest first) to fetch a backup for: their coarsest frame, requested
// before the planned ones while the link is fast. Each arrived backup
// shortens what a fall would leave by a whole coarsest frame (a level-0
// frame of the same link time, by less than half of one), so the exposure
// ends soon and the planned requests follow. A chunk with a backup can
// then be delivered at the backup's level at no further link time (its
// bytes are already counted), or at a finer level for that level's whole
// frame. Backups come out of spare slack only: all of them within a third
// of the spare time the plan leaves (the smaller of the link's and the
// decoder's: a backup delays the next chunk's decode too), so on a link
// that holds they cost no quality, and most of the slack stays for the
// estimate's noise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

namespace cachegen {

struct PlannerOptions {
  double deadline_s = 1.0;               // from the start of the transfer
  double recompute_tokens_per_s = 0;     // 0: never recompute
  double initial_bandwidth_bytes_s = 0;  // prior estimate; 0 = unknown
  double smoothing = 0.5;                // weight of the newest bandwidth sample (EWMA)
  // Share of the estimated bandwidth (and of the decoder's estimated speed)
  // the plan may use while the spread of either is unknown; the most
  // conservative derating used (see LevelPlanner::Margins).
  double safety = 0.9;
  // Share of the deadline kept free at the end, at most. Replanning after
  // every chunk spends each plan's slack, so without it the transfer
  // converges onto the deadline and the last chunk's noise decides. Once the
  // spread of the link and of decode times is measured, the reserve is sized
  // from it instead (never above this share).
  double reserve = 0.05;
  // Standard deviations of the measured noise the measured margins cover.
  double spread_sigmas = 2.0;
  // false: always the configured margins (safety, reserve), whatever the
  // spread measured (the client before measured margins; a baseline).
  bool measured_margins = true;
  // false: Plan::hedge stays empty.
  bool hedge = true;
  // Hedging insures against the link falling to 1/hedge_drop of its
  // estimate (<= 1: never hedge).
  double hedge_drop = 10;
  // Bytes a fallen link carries before the client acts on the fall: the
  // rate estimator needs one short window (256 KB) at the new rate to see
  // it and one more to settle before requests in flight are re-issued
  // (RateEstimator::settled). Requests in flight keep their fine frames
  // meanwhile, so hedging counts these bytes as lost to the fall.
  uint64_t hedge_react_bytes = 512u << 10;
  // Decoder seconds lost per byte received, until measured (LevelPlanner,
  // "Receiving shares the CPU"); 0 = none.
  double receive_cost_s_per_byte = 0;
  // Decode seconds per token until a chunk was processed (a client's
  // earlier fetches on this machine); 0 = unknown (decodes cost nothing).
  double decode_s_per_token = 0;
  // Per level (index = level), decode seconds per token measured over a
  // client's earlier fetches on this machine; 0 or absent = not measured.
  // They give the levels' decode times relative to each other, which one
  // fetch cannot learn in time (DecodeSeconds); the machine's speed now is
  // taken from the chunks this fetch processes.
  std::vector<double> level_decode_s_per_token;
  // The decoder's spread (LevelPlanner::DecodeCv) measured by a client's
  // earlier fetches on this machine; 0 = unknown. Margins follow it from the
  // first plan (until this fetch measures its own).
  double decode_cv = 0;
};

// Spread of the link's goodput, measured over disjoint segments of the
// current rate regime (RateEstimator::spread).
struct LinkSpread {
  int segments = 0;       // segments measured; 0 = unknown
  double rate_cv = 0;     // standard deviation of the segments' rates / their mean
  double time_sd_s = 0;   // standard deviation of a segment's duration around bytes / mean rate
};

// The margins a plan keeps (LevelPlanner::Margins).
struct PlanMargins {
  double link_safety = 1;    // share of the estimated bandwidth used
  double decode_safety = 1;  // share of the estimated decoder speed used
  double reserve_s = 0;      // time kept free before the deadline
  // Standard deviation of the sum of the decodes ahead (0 while the
  // decoder's spread is unknown): the escape's margin for the decoder.
  double decodes_sd_s = 0;
};

// A request issued and not delivered yet.
struct InFlight {
  uint32_t chunk = 0;
  int level = 0;
  uint64_t received = 0;  // bytes of its frame that have arrived
};

// What is known of one chunk before fetching it.
struct PlanChunk {
  uint32_t tokens = 0;
  std::vector<uint64_t> level_bytes;  // per level (0 = finest); 0 = level not available
  // Its finest and coarsest available levels; -1 if none.
  int finest() const;
  int coarsest() const;
};

struct ChunkDecision {
  int level = -1;  // level to fetch; -1 = recompute
  bool recompute() const { return level < 0; }
};

struct Plan {
  std::vector<ChunkDecision> decisions;  // for chunks [first, size)
  uint32_t first = 0;
  bool feasible = false;  // the planned transfer is expected to end by the deadline
  double expected_s = 0;  // expected time from now to the end
  // Per InFlight entry given to Replan: the coarser level to request that
  // chunk again at (abandoning the request), or -1 to let it finish. The
  // level of the chunk's backup (Replan's `backups`) means: abandon it and
  // use the backup.
  std::vector<int> reissue;
  // Chunks (not requested yet, latest first) worth a backup now: a request
  // of the coarsest level, issued early, next to the planned one (see
  // LevelPlanner, "Hedging").
  std::vector<uint32_t> hedge;
};

class LevelPlanner {
 public:
  LevelPlanner(std::vector<PlanChunk> chunks, PlannerOptions options);

  // A bandwidth sample: `bytes` were delivered over `seconds` (aggregate
  // goodput of the link, e.g. bytes since the previous completion over the
  // time since it). Ignored when seconds <= 0.
  void OnDelivered(uint64_t bytes, double seconds);
  // Replaces the estimate (bytes/s) by one made elsewhere (RateEstimator);
  // ignored unless > 0.
  void SetBandwidth(double bytes_per_s);
  // Time to process a chunk of `tokens` tokens after it arrived (decode),
  // smoothed like bandwidth; with its level (>= 0) it also feeds that
  // level's decode estimate (DecodeSeconds), and with its tokens too, the
  // machine's speed relative to the per-level prior.
  void OnProcessed(double seconds, int level = -1, uint32_t tokens = 0);
  // Estimated decode time of chunk c at `level`:
  // - where PlannerOptions::level_decode_s_per_token has the level:
  //   that x the chunk's tokens x the machine's speed now (the ratio of the
  //   times this fetch saw to that prior, averaged over every level's
  //   decodes, the prior counting as kTrustedSamples: 1 before any). A
  //   coarse level decodes a little faster than a fine one (fewer bits to
  //   entropy-decode: measured on the 2-core VM, 16 chunks at level 3 took
  //   4-6 ms less than at level 0, of about 60), which decides deadlines a
  //   few ms above the decode time, and one fetch sees too few decodes of
  //   each level to learn it; and one level's own few samples estimate
  //   its time less well than every decode's ratio to the prior does;
  // - else the smoothed time seen at that level, once it has been seen 3
  //   times (one fast sample on a loaded machine must not make a level look
  //   faster);
  // - else the nearest level seen 3 times, else the smoothed time of every
  //   level seen; before any chunk was processed,
  //   PlannerOptions::decode_s_per_token x the chunk's tokens.
  double DecodeSeconds(uint32_t c, int level) const;
  // A decode ran `wall_s`, of which the decoder's own thread ran `cpu_s`,
  // while `bytes` arrived. ReceiveCost() = the time lost (wall - cpu) over
  // the bytes, summed over the decodes during which bytes arrived, once
  // there are 3 of them and kReceiveCostBytes (4 MiB) arrived; before,
  // PlannerOptions::receive_cost_s_per_byte. Time lost while nothing
  // arrived (other work on the machine) is not counted; time lost to other
  // work while a few bytes arrived is, which is why it takes that many
  // bytes: on a slow link a decode sees a few KB arrive, and a ms lost to
  // anything else would read as a receive cost tens of times the real one
  // (harmless there, but carried to the client's next fetch, maybe on a
  // fast link).
  void OnDecoderLoss(double wall_s, double cpu_s, uint64_t bytes);
  // Decoder seconds lost per byte received (see above).
  double ReceiveCost() const;
  // Whether ReceiveCost() is measured (else the prior).
  bool receive_cost_measured() const {
    return decoder_loss_samples_ >= kTrustedSamples && decoder_loss_bytes_ >= kReceiveCostBytes;
  }
  static constexpr double kReceiveCostBytes = 4 << 20;

  // The link's measured spread (RateEstimator::spread); margins follow it
  // once it covers 3 segments.
  void SetLinkSpread(const LinkSpread& spread) { link_ = spread; }
  // The margins the next plan keeps. Until a spread is known, the configured
  // ones: `safety` on both stages and `reserve` of the deadline. The link's
  // spread is known once measured over 3 segments; the decoder's once 3
  // decode times were measured each after an earlier one at its level, or
  // from the start where an earlier fetch measured it (decode_cv). With
  // z = spread_sigmas, the link's derating is then 1 - z * rate_cv, the
  // decoder's 1 - z * (decode time's standard deviation / its mean) /
  // sqrt(decodes_ahead) (the decodes still to run add up, and their sum
  // spreads sqrt(k) times less, relative to it, than one decode: in the
  // streaming simulation, whose decode noise is independent, the margin of
  // one decode cost a level at deadlines a few % above the level-0 time),
  // neither below `safety` nor above 0.99. A plan uses half of each
  // stage's derating; the escape all of the link's, and z x decodes_sd_s
  // for the decoder ("Escape"). Once both spreads are known, or
  // the decoder's where the fetch is decode-bound whatever the plan
  // (decode_bound: every chunk's finest frame crosses the link in under
  // half the decode time at the coarsest, so the link's noise cannot move
  // the end; a fast link never gives the 3 segments in one fetch), the
  // reserve is z standard deviations of the end's noise (a segment's timing
  // and one decode, independent) plus 0.5 % of the deadline, never above the
  // configured share. On a steady link (a token bucket: its rate is exact,
  // its bursts a few ms) the fixed margins made the client end tens of ms
  // early at a coarser level than a fixed client that met the deadline by
  // 3 %; on a noisy one the measured margins are the configured ones.
  PlanMargins Margins(size_t decodes_ahead = 1, bool decode_bound = false) const;
  // The decoder's measured spread: the standard deviation of decode times
  // around their level's estimate over the mean decode time, once 3 are
  // measured; else 0.
  double DecodeCv() const;
  bool decode_spread_measured() const { return decode_residuals_ >= kTrustedSamples && decode_any_s_ > 0; }

  // Estimated bandwidth in bytes/s; 0 while unknown.
  double bandwidth() const { return bandwidth_; }
  double tail_s() const { return tail_s_; }

  // The plan for chunks [first, n) at `elapsed_s` since the start, with
  // `outstanding_bytes` requested but not yet delivered. While the bandwidth
  // is unknown, the plan is the decoder's alone (the link taken as free),
  // and callers fetch only the first chunk (a probe) before replanning. So
  // the probe is at the finest level the decoder's time leaves: one chunk
  // of n costs at most 1/n of the time difference between the finest and
  // the coarsest fixed level on the link, which the replan takes back from
  // the later chunks, whereas a coarse probe would cost quality whenever the
  // link turns out fast; but a level the decoder cannot finish in time is
  // wrong whatever the link (a fast link is where the rate forms last: a
  // probe there takes a round trip and far less link time than the floors
  // of RateEstimator).
  // `pending_decode_s`: decode time still ahead for chunks requested or
  // fetched but not yet processed (see DecodeSeconds).
  Plan Replan(uint32_t first, double elapsed_s, uint64_t outstanding_bytes, double pending_decode_s = 0) const;
  // The same with the requests in flight described one by one (chunks <
  // first, in chunk order), so the plan may re-issue them (Plan::reissue);
  // pending_decode_s then covers only chunks fetched and not yet processed.
  Plan Replan(uint32_t first, double elapsed_s, std::span<const InFlight> inflight,
              double pending_decode_s = 0) const;
  // The same with backups (at most one per chunk, chunks not delivered yet):
  // requests of a chunk's coarsest level next to its planned one. Their bytes
  // still to come count as outstanding; chunks >= first and chunks in
  // `inflight` may use them (Plan::decisions / Plan::reissue at the backup's
  // level), and the plan may name more (Plan::hedge). pending_decode_s covers
  // chunks < first that will be delivered from a backup.
  Plan Replan(uint32_t first, double elapsed_s, std::span<const InFlight> inflight,
              std::span<const InFlight> backups, double pending_decode_s) const;

  size_t size() const { return chunks_.size(); }
  const PlanChunk& chunk(uint32_t i) const { return chunks_[i]; }

  // Level actually used for chunk c when level l is asked: l if available,
  // else the nearest coarser available, else the nearest finer; -1 if none.
  int Resolve(uint32_t c, int level) const;
  // Coarsest available level of chunk c; -1 if none.
  int Coarsest(uint32_t c) const;
  // Number of levels (the longest level_bytes).
  int levels() const { return levels_; }

 private:
  uint64_t Bytes(uint32_t c, int level) const;  // at Resolve(c, level)
  uint64_t FrameBytes(uint32_t c, int level) const;  // at exactly `level`; 0 if absent
  uint64_t BackupTotal(std::span<const InFlight> backups) const;  // their frames' bytes
  struct Slot;
  // PlannerOptions::level_decode_s_per_token[level] x tokens; 0 = none.
  double PriorDecodeSeconds(int level, uint32_t tokens) const;
  // backup[c]: level of chunk c's backup, -1 = none (its bytes still to come
  // are in kept_bytes); backup_total: the frame bytes of every backup.
  Plan Solve(uint32_t first, double elapsed_s, uint64_t kept_bytes, std::span<const InFlight> inflight,
             const std::vector<int>& backup, uint64_t backup_total, double pending_decode_s) const;

  std::vector<PlanChunk> chunks_;
  PlannerOptions options_;
  int levels_ = 0;
  double bandwidth_ = 0;
  double tail_s_ = 0;
  bool have_tail_ = false;
  std::vector<double> decode_s_;     // per level, smoothed
  std::vector<int> decode_seen_;     // samples per level
  double decode_any_s_ = 0;          // smoothed over every level
  int decode_samples_ = 0;
  double prior_speed_ = 1;           // smoothed (decode time seen / per-level prior)
  int prior_speed_samples_ = 0;
  // The machine speed's EWMA weight once it is at least 1 / (decodes seen +
  // kTrustedSamples) (a running mean before, the prior counted as
  // kTrustedSamples decodes): one
  // decode's time spreads by about 12 % on the 2-core VM, and at weight
  // 0.5 the estimate spread 7 %, correlated over every decode still ahead;
  // at 0.1 it spreads 3 % and still follows a change of the machine's load
  // within about ten decodes.
  static constexpr double kSpeedSmoothing = 0.1;
  double decode_sq_residuals_ = 0;   // sum of (sample - its level's estimate before it)^2
  int decode_residuals_ = 0;
  double decoder_lost_s_ = 0;        // OnDecoderLoss sums
  double decoder_loss_bytes_ = 0;
  int decoder_loss_samples_ = 0;
  LinkSpread link_;
  static constexpr int kTrustedSamples = 3;
  // The link's rate in a plan made before it is measured: one whose time
  // counts for nothing next to the decoder's.
  static constexpr double kFreeLinkBytesPerS = 1e15;
  std::vector<double> level_total_;  // bytes of all chunks per level
};

// Link goodput from progress: the caller reports, now and then, the bytes
// received so far by every request (abandoned ones too: they used the link)
// against the link's busy time (seconds during which something was requested
// and unfinished). Two windows: a long one for the steady estimate, and a
// short one that detects a drop: when the short window's rate is below
// drop_ratio x the estimate, the estimate takes it at once and the long
// window restarts there. Each window spans at least its bytes and its
// seconds: a shaped link delivers in bursts, and a window of k bursts
// measures the rate within about 1/k; the time floor keeps a stall of the
// reading threads (CPU contention) on a fast link from reading as a drop.
// Until the long window is full the short one answers. The spread of the
// rate is measured over disjoint segments (each at least the long window's
// bytes and seconds) since the regime began. Pure logic: no clocks.
class RateEstimator {
 public:
  struct Options {
    uint64_t long_bytes = 1u << 20;
    double long_s = 0.02;
    uint64_t short_bytes = 256u << 10;
    double short_s = 0.015;
    // A finished request gives the first estimate (ObserveCompletion) once
    // this much busy time has passed: a frame that arrives within a
    // millisecond (10 Gbit/s on loopback) measures the threads, not the link.
    double completion_s = 0.005;
    double drop_ratio = 0.5;
  };
  RateEstimator() : RateEstimator(Options()) {}
  explicit RateEstimator(Options options) : options_(options) {}
  // Cumulative bytes received at busy time busy_s (both non-decreasing),
  // counted from the origin (0, 0): the moment the first request went out.
  // The windows begin there, not at the first observation: a client looks
  // a tick after its first request, or once a whole frame has arrived, and
  // a window from that look would miss the probe's first bytes and their
  // time (at 10 Gbit/s the first estimate then waited for 3-4 probes).
  void Observe(double busy_s, uint64_t total_bytes);
  // The same where a request has just finished. Until the first window has
  // filled, the mean rate since the origin becomes the estimate
  // (if it spans completion_s and short_bytes): a whole frame spans its
  // bursts, and a client that probes one request at a time until it has an
  // estimate would otherwise probe again (at 1 Gbit/s a level-0 frame takes
  // 8 ms, the short window's floor 15 ms: three frames probed one after the
  // other).
  void ObserveCompletion(double busy_s, uint64_t total_bytes);
  // Bytes/s; 0 until short_bytes have arrived (or a request finished).
  double rate() const { return rate_; }
  // Drops detected so far.
  int drops() const { return drops_; }
  // Whether the estimate has outlived one more short window (short_s
  // seconds) since its regime began (the origin, or the start of
  // the window that showed the newest drop), with at least short_bytes
  // arrived: a dip that lasts less was a stall of the reading or sending
  // threads more often than a change of the link. Costly reactions (abandoning
  // requests) wait for it; the estimate itself follows at once.
  bool settled() const;
  // Spread of the segments' rates and durations in the current regime (a
  // drop starts a new one); segments = 0 before the first.
  LinkSpread spread() const;

 private:
  // Rate over the newest window of at least `bytes` and `seconds` (its first
  // point's index in *start), or 0.
  double WindowRate(uint64_t bytes, double seconds, size_t* start) const;
  Options options_;
  std::deque<std::pair<double, uint64_t>> history_{{0, 0}};  // (busy_s, total), oldest first; the origin
  std::pair<double, uint64_t> regime_{0, 0};                  // where the current estimate's regime began
  std::pair<double, uint64_t> segment_start_{0, 0};       // where the segment being measured began
  std::vector<std::pair<double, uint64_t>> segments_;  // (seconds, bytes) of the regime's segments
  double rate_ = 0;
  int drops_ = 0;
};

}  // namespace cachegen
