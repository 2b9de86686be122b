// StreamClient: fetch a context's cached chunks from a ChunkStore (a local
// backend, or a service through ConnectService) under a deadline, adapting
// each chunk's quality level to the measured bandwidth (the planner,
// src/stream/planner.h).
//
// Fetch looks up the longest cached prefix, then requests chunks in order
// with up to `inflight` requests outstanding (beyond two, only while they
// take less than `queue_ms` at the measured rate; at most `read_ahead` chunks
// requested or fetched ahead of the decoder), decodes chunk i while later
// chunks are in flight, and hands each decoded chunk to the callback in chunk
// order as soon as it is ready, on the calling thread, so an engine can
// inject progressively. The adaptive client measures the link while frames
// arrive (stores that report progress: the service client), and when the
// rate falls it re-requests chunks in flight at a coarser level if the
// deadline needs it (LevelPlanner::Replan with InFlight). Chunks
// the planner gives up on (they cannot arrive in time even at the coarsest
// level and recomputing them is cheaper) and chunks that fail (missing,
// corrupt, unreachable) are not delivered: they are returned in `recompute`.
// Nothing undecodable is ever delivered.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/status.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"

namespace cachegen {

struct StreamOptions {
  double deadline_ms = 1000;           // from the call to Fetch
  double recompute_tokens_per_s = 0;   // engine's prefill speed; 0 = never plan recompute
  uint32_t inflight = 4;               // requests outstanding at once (>= 1)
  // Chunks requested or fetched but not yet decoded, at most (>= 1; the
  // in-flight requests count). Bounds the frames held in memory when the
  // decoder is the slower stage, and keeps level choices for later chunks
  // until the decode times seen so far can inform them.
  uint32_t read_ahead = 8;
  // Beyond two outstanding requests, issue another only while the
  // outstanding bytes take less than this at the estimated bandwidth (and
  // none while it is unknown). Enough to keep a fast link busy; requests
  // that share a slow link arrive together, which delays the first decode;
  // and it bounds what a bandwidth drop strands in flight at levels chosen
  // for the old rate (the adaptive client re-issues the rest coarser).
  double queue_ms = 10;
  int fixed_level = -1;                // >= 0: always this level (no adaptation; a baseline)
  double initial_bandwidth_bytes_s = 0;  // prior; 0 = unknown (the first chunk alone probes, at the finest level)
  double smoothing = 0.5;              // EWMA weight of the newest bandwidth sample
  double safety = 0.9;    // share of the estimated bandwidth the plan may use, at least (PlannerOptions::safety)
  double reserve = 0.05;  // share of the deadline the plan keeps free, at most (PlannerOptions::reserve)
  bool measured_margins = true;  // margins from the measured spread (PlannerOptions::measured_margins)
  bool hedge = true;             // backups of late chunks from spare slack (PlannerOptions::hedge)
  uint32_t levels = kMaxChunkLevels;   // levels to look up per chunk
  uint32_t decode_threads = 1;
  DType dtype = DType::kF16;           // dtype of the delivered tensors
  // The shape every chunk must have (tokens ignored): a frame of another
  // shape is a miss. Zero layers: the first frame taken sets it.
  KVShape shape;
  // The model profiles chunk frames may reference (DecodeFrame); null: none.
  std::shared_ptr<const ProfileSet> profiles;
  // The deadline bounds the whole fetch, lookup included, whatever the store
  // does: at it the fetch returns what it delivered, the rest in
  // `recompute`, with a "timed out" line in `errors` (timed_out); store
  // calls still under way end on their own (the client waits for them only
  // when it is destroyed). False: the deadline is a target only, and every
  // chunk fetched is delivered however late (bench-stream scores lateness).
  bool stop_at_deadline = true;
  // Once *cancel is true the fetch ends within a tick (2 ms), or when the
  // running decode or a store read that cannot be abandoned ends: chunks not
  // handed over come back in `recompute`, with one "cancelled" line in
  // `errors`. For shutdown (llama-serve's Stop). Not owned; null: never.
  const std::atomic<bool>* cancel = nullptr;
};

struct StreamedChunk {
  uint32_t index = 0;  // chunk index in the request
  uint32_t level = 0;
  uint32_t token_start = 0;  // from the frame header
  uint64_t bytes = 0;        // frame bytes fetched
  const KVTensor* kv = nullptr;  // valid during the callback only
};
using ChunkCallback = std::function<void(const StreamedChunk&)>;

struct StreamResult {
  uint32_t requested = 0;  // chunks asked for
  uint32_t cached = 0;     // length of the cached prefix found by the lookup
  std::vector<int> levels;  // per cached chunk: level delivered, -1 = not delivered (recompute)
  std::vector<uint32_t> recompute;  // chunk indices (< cached) the engine must recompute
  std::vector<std::string> errors;  // one line per chunk that failed to fetch or decode, and the lookup's failure
  // Ok, or why the store could not answer the prefix lookup (unreachable,
  // failing): the prefix ended there, and the chunks after it count as not
  // cached. An engine goes on (it recomputes them); a tool should say so.
  Status lookup_status;
  uint64_t bytes = 0;               // frame bytes fetched
  double elapsed_ms = 0;            // lookup to last delivery
  double lookup_ms = 0;             // of which the prefix lookup
  double decode_ms = 0;             // summed decode time of delivered chunks (overlaps transfers)
  bool deadline_met = false;  // ended within the deadline, every chunk delivered or planned for recompute
  bool timed_out = false;     // the deadline ended the fetch (StreamOptions::stop_at_deadline)
  double bandwidth_bytes_s = 0;  // final estimate; 0 when the link was never busy long enough to measure
  uint32_t reissued = 0;         // requests abandoned and re-issued at a coarser level (or for a backup)
  uint64_t abandoned_bytes = 0;  // bytes those had received (moved over the link, not delivered)
  uint32_t backups = 0;          // backup requests (hedging: a chunk's coarsest level, next to its planned one)
  uint32_t from_backup = 0;      // chunks delivered from their backup
  // Frames that arrived but did not prove to be their chunk (FrameIsChunk:
  // damaged, misplaced, unbound, another token range or shape): misses.
  uint32_t rejected = 0;
  // Requests for another stored level of a chunk whose frame failed.
  uint32_t fallbacks = 0;
  // Decoder time lost per byte received, as the planner used it last
  // (LevelPlanner::ReceiveCost; 0 with several decode threads: not measured).
  double receive_cost_ns_per_byte = 0;
};

struct FetchStragglers;  // internal (client.cc)

class StreamClient {
 public:
  // `store` is not owned and must outlive the client; it must be thread-safe
  // (every ChunkStore is). Fetch may be called from several threads at once.
  // A client keeps the tensors of decoded chunks for its next decodes, this
  // fetch's and later ones', as many as a fetch holds at once (read_ahead +
  // 2, the largest of its fetches so far): a new tensor's pages fault in on
  // first write, which can cost more than the decode (measured on a 2-core
  // VM: 20-35 ms for a chunk's 8.4 MB against 3.5 ms of decode). So keep one
  // client for a sequence of fetches.
  explicit StreamClient(ChunkStore* store);
  ~StreamClient();
  StreamClient(StreamClient&&) noexcept;
  StreamClient& operator=(StreamClient&&) noexcept;

  // Streams the chunks `keys` (chunk i holds chunk_tokens[i] tokens: the
  // recompute cost). Non-ok only for unusable arguments; per-chunk failures
  // are in the result.
  Result<StreamResult> Fetch(std::span<const ChunkKey> keys, std::span<const uint32_t> chunk_tokens,
                             const StreamOptions& options, const ChunkCallback& on_chunk) const;

  // The same for a token sequence: keys from ChunkKeys(root, tokens, chunk_size).
  Result<StreamResult> FetchTokens(const ChunkKey& root, std::span<const TokenId> tokens, uint32_t chunk_size,
                                   const StreamOptions& options, const ChunkCallback& on_chunk) const;

 private:
  struct TensorPool;
  ChunkStore* store_;
  std::unique_ptr<TensorPool> pool_;
  struct MachineCosts;
  std::unique_ptr<MachineCosts> costs_;
  // Threads of fetches that returned at their deadline while the store had
  // not answered yet; joined by the destructor (the store outlives the client).
  std::unique_ptr<FetchStragglers> stragglers_;
};

}  // namespace cachegen
