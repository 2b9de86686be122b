// Internal: the streaming client's decisions for one fetch, apart from how
// requests travel, how frames decode and what time it is. A FetchSession
// holds each chunk's state (requested at which level, arrived, backed up,
// decoded) and decides what to request, abandon, back up, decode and hand
// over; a driver runs it: StreamClient::Fetch over a real store, threads and
// the steady clock, and sim::SimulateFetch over a modelled link and decoder
// on a virtual clock (fetch_sim.h). Both call the same methods in the same
// order, so the policy a simulation judges is the one the client runs.
//
// A driver's loop:
//   while (!session.done()) {
//     report every request that finished (OnArrived) and every decode that
//     finished (OnDecoded);
//     if (session.Step()) continue;
//     wait until a request or a decode finishes, or a tick (2 ms) passes;
//   }
//   session.Finish();
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stream/planner.h"
#include "cachegen/status.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"

namespace cachegen {

// What a session's driver does for it. Requests and decodes are named by the
// chunk and by whether they are the chunk's backup (hedging, LevelPlanner);
// a request also by the id Issue gave it.
class FetchIo {
 public:
  virtual ~FetchIo() = default;
  // Seconds since the fetch began (its clock: the only one the policy reads).
  virtual double Now() const = 0;

  // Requests chunk `chunk`'s frame at `level`; returns its id (> 0). The
  // driver answers with OnArrived once it finished, unless cancelled.
  virtual uint64_t Issue(uint32_t chunk, int level) = 0;
  // Abandons a request: its bytes still to come are not needed (it may
  // still be answered; the session ignores the answer).
  virtual void Cancel(uint64_t request) = 0;
  // Bytes of a request's frame arrived so far.
  virtual uint64_t Received(uint64_t request) const = 0;
  // Bytes arrived for every request, abandoned ones included.
  virtual uint64_t ReceivedTotal() const = 0;
  // Seconds the link had work, less each request's round trip (LinkClock:
  // the union over requests of [issued + round trip, finished]), so that a
  // fetch requesting one frame at a time does not read its round trips as
  // a slower link. Non-decreasing.
  virtual double BusySeconds() const = 0;
  // The session needs a finished request's frame no more.
  virtual void Forget(uint64_t request) = 0;

  // The decoder: one decode runs at a time and one more may wait behind it.
  // Whether (chunk, from_backup) waits, runs, or finished and was not
  // reported yet.
  virtual bool DecoderHas(uint32_t chunk, bool from_backup) const = 0;
  virtual bool DecoderFull() const = 0;   // one decode waits already
  virtual bool DecoderIdle() const = 0;   // nothing waits or runs or is unreported
  // Takes back the waiting decode if its chunk is after `chunk`.
  virtual void UnsubmitAfter(uint32_t chunk) = 0;
  // Decodes the frame of `request` (chunk's, or its backup's). Requires
  // !DecoderFull(). The driver answers with OnDecoded.
  virtual void Submit(uint32_t chunk, bool from_backup, uint64_t request) = 0;
  // A decoded chunk that will not be handed over (its memory back).
  virtual void Discard(uint32_t chunk, bool from_backup) = 0;
  // Hands decoded (chunk, from_backup), the frame of `request` at `level`,
  // to the engine; then neither the decode nor the frame is needed.
  virtual void HandOver(uint32_t chunk, bool from_backup, uint64_t request, int level) = 0;
};

// A finished decode's costs: wall time, the decoding thread's CPU time, and
// the bytes that arrived meanwhile (LevelPlanner::OnDecoderLoss).
struct DecodeCost {
  double wall_s = 0;
  double cpu_s = 0;
  uint64_t arrived = 0;
};

class FetchSession {
 public:
  // chunks: what the lookup found (per level bytes, and each chunk's tokens:
  // its recompute cost). static_levels (one per chunk, -1 = recompute)
  // replaces the planner with a fixed per-chunk plan (a baseline); with
  // options.fixed_level >= 0, every chunk at that level. names: how errors
  // name chunk i (e.g. its key), "chunk i" when absent.
  FetchSession(FetchIo* io, std::vector<PlanChunk> chunks, const StreamOptions& options,
               const PlannerOptions& planner_options, std::vector<int> static_levels = {},
               std::vector<std::string> names = {});

  // A request finished: its frame, proved to be its chunk at its level
  // (ok), or why not. bytes: the frame's size.
  void OnArrived(uint64_t request, const Status& status, uint64_t bytes);
  // A decode finished.
  void OnDecoded(uint32_t chunk, bool from_backup, const Status& status, const DecodeCost& cost);
  // One round of decisions: keep the decoder busy, measure the link, abandon
  // what the deadline needs coarser, issue requests, hand over at most one
  // chunk. True: call again at once (something changed that the next round
  // acts on); false: wait for an event or a tick.
  bool Step();
  bool done() const { return next_deliver_ >= chunks_.size(); }
  // Chunks handed over or given up so far (in chunk order).
  uint32_t delivered() const { return next_deliver_; }
  // A line for the result's errors (a driver's own: lookup, timeout).
  void AddError(std::string line) { result_.errors.push_back(std::move(line)); }
  // Ends the fetch at `elapsed_s` (done() or not): chunks not handed over go
  // to `recompute`.
  void Finish(double elapsed_s);

  StreamResult& result() { return result_; }
  const LevelPlanner& planner() const { return planner_; }
  // Per level: decode cost seconds and tokens of the chunks handed over.
  const std::array<double, kMaxChunkLevels>& level_decoded_s() const { return level_decoded_s_; }
  const std::array<double, kMaxChunkLevels>& level_decoded_tokens() const { return level_decoded_tokens_; }

 private:
  struct Request {
    uint64_t id = 0;
    uint32_t chunk = 0;
    int level = 0;
  };
  struct Arrival {  // a finished request
    Request request;
    Status status;
    uint64_t bytes = 0;
    bool ok() const { return status.ok(); }
  };
  struct Decoded {  // a finished decode, not handed over yet
    bool from_backup = false;
    Status status;
    DecodeCost cost;
  };
  // One chunk's state in the fetch.
  struct Chunk {
    int issued_level = -1;    // of its latest planned request
    uint32_t tried = 0;       // levels requested, a bit each (UntriedLevel)
    bool reissued = false;    // abandoned once for a coarser level
    bool skipped = false;     // recompute: planned so, or failed
    std::optional<Arrival> ready;  // its planned request's answer
    // Its backup (hedging, LevelPlanner): at most one, its coarsest level.
    std::optional<Request> backup;
    bool backup_open = false;     // requested, not finished
    bool backup_failed = false;   // finished without a frame, not cancelled
    bool backup_dropped = false;  // cancelled: the planned frame came
    bool use_backup = false;      // to be handed over from its backup
    std::optional<Arrival> backup_ready;
    std::optional<Decoded> ahead;  // decoded, not handed over
  };

  Request Send(uint32_t c, int level);
  void Fail(uint32_t c, const std::string& why);
  void Observe();
  std::vector<InFlight> InFlightNow() const;
  std::vector<InFlight> Backups() const;
  double PendingDecode() const;
  uint32_t OpenBackups() const;
  void DropBackup(uint32_t c);
  bool HasBackup(uint32_t c, int level) const;
  bool DecodedAhead(uint32_t c) const;
  void Discard(uint32_t c);
  void Reissue();
  bool QueueFull() const;
  void IssueRequests();
  int UntriedLevel(uint32_t c, int failed) const;
  const Arrival* FrameToDecode(uint32_t c) const;
  void StartDecode(uint32_t c, const Arrival& a);
  void DecodeNext();
  bool DeliverOne();
  bool ChunkWanted(uint32_t c) const;

  FetchIo* const io_;
  const StreamOptions options_;
  const std::vector<int> static_levels_;
  const std::vector<std::string> names_;
  const bool adaptive_;
  const bool decoder_measured_;  // one decode thread: its CPU time is measured
  LevelPlanner planner_;
  RateEstimator rate_;
  std::vector<Chunk> chunks_;
  std::vector<Request> flight_;  // planned requests outstanding, in chunk order
  uint32_t next_issue_ = 0, next_deliver_ = 0;
  bool issued_any_ = false;
  // When the decode running now began, as far as the session saw (a
  // Submit to an idle decoder, or the report of the decode before it);
  // < 0 before the first.
  double decode_began_ = -1;
  StreamResult result_;
  std::array<double, kMaxChunkLevels> level_decoded_s_{}, level_decoded_tokens_{};
};

// The planner's options for a fetch with these stream options (the
// machine's measured costs are the caller's to add).
PlannerOptions PlannerOptionsFor(const StreamOptions& options);

}  // namespace cachegen
