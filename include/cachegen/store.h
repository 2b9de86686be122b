// Content-addressed chunk store: encoded frames (one chunk of a context at one
// quality level) addressed by (ChunkKey, level).
//
// Backends are selected by URI (see OpenStore). Every backend verifies what it
// reads: a chunk whose stored bytes fail their checksum is reported as
// kNotFound (and counted in StoreStats::corrupt), never returned.
//
// Thread safety: every method of a ChunkStore may be called concurrently from
// several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/chunk_key.h"
#include "cachegen/status.h"

namespace cachegen {

// Counters since the store was opened (this process only).
struct StoreStats {
  uint64_t puts = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;   // absent, corrupt or unreachable
  uint64_t corrupt = 0;  // subset of misses: stored bytes failed verification
  uint64_t evictions = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  // What the store holds now, where it keeps count (mem://; 0 elsewhere):
  // stored bytes (frames and their record headers) and frames.
  uint64_t held_bytes = 0;
  uint64_t held_frames = 0;
};

class ChunkStore {
 public:
  virtual ~ChunkStore() = default;

  // Stores `frame` for (key, level), replacing any previous bytes. Atomic:
  // a concurrent or later reader sees the old bytes or the new ones, never a
  // mix, even if the process dies mid-write.
  virtual Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) = 0;

  // The stored bytes, verified. kNotFound when absent or corrupt; kIOError
  // when the backend cannot be reached.
  virtual Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) = 0;

  // Size in bytes of the stored frame without reading it; kNotFound when absent.
  virtual Result<uint64_t> Size(const ChunkKey& key, uint32_t level) = 0;

  // Removes (key, level). Removing an absent entry is not an error.
  virtual Status Delete(const ChunkKey& key, uint32_t level) = 0;

  // Get, telling `progress` the frame bytes received so far; `progress`
  // returning false abandons the read (kIOError "... cancelled"). Stores
  // whose reads take long enough to watch (the chunk service's client)
  // report as bytes arrive, the others once, when the frame is read (the
  // default). The streaming client measures the link by it, and abandons a
  // request it re-issues at a coarser level. Null `progress`: Get.
  using Progress = std::function<bool(uint64_t received)>;
  virtual Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level,
                                                       const Progress& progress);

  // The stored sizes of levels [0, levels) of each key of the longest prefix
  // of `keys` stored at some level: level_bytes[i][l] for keys[i], 0 where
  // that level is absent. store_error: why the prefix ended early where the
  // store could not answer (ok: it ended at a miss or at the last key). Non-ok
  // when the lookup itself failed. In one round trip where the backend can
  // (the chunk service's client: POST /v1/lookup); by default Size() per key
  // and level.
  struct PrefixSizes {
    std::vector<std::vector<uint64_t>> level_bytes;
    Status store_error;
  };
  virtual Result<PrefixSizes> SizesOfPrefix(std::span<const ChunkKey> keys, uint32_t levels);

  virtual StoreStats stats() const = 0;

  // The URI this store was opened with (credentials elided).
  virtual std::string uri() const = 0;
};

// Opens a store by URI:
//   file:///abs/path[?max_bytes=N]   embedded default: one file per chunk-level
//   mem://[?max_bytes=N]             in-process LRU
//   redis://[[user]:password@]host:port[?ttl=S]  a single Redis server
//   redis-cluster://h1:p1,h2:p2[?ttl=S]  Redis Cluster (any reachable seeds)
// Redis URIs also take connect_timeout_ms (default 1000), timeout_ms (per
// command, default 2000) and pool (idle connections per server, default 8).
// Unknown schemes, unknown parameters or malformed URIs are kInvalidArgument;
// a Redis server or cluster that does not answer at open is kIOError.
// A host-memory tier in front of `back`: an in-process LRU (mem://) of at
// most `max_bytes` that reads go to first. A read it misses goes to `back`
// and what comes back is kept; writes go to `back` and then the tier (a
// failed write to `back` is returned, the tier keeps the frame all the same).
// `back` may be null: memory only. stats() are the tier's (its hits, misses,
// evictions and what it holds); the backing store's are its own. uri():
// "mem://?max_bytes=N+<back's uri>".
std::unique_ptr<ChunkStore> WithMemoryTier(std::unique_ptr<ChunkStore> back, uint64_t max_bytes);

struct OpenStoreOptions {
  // file://: create the store's directory where it is missing. false (for
  // commands that only read): a missing directory is kNotFound, so that a
  // mistyped path is not read as an empty store and left behind.
  bool create = true;
};
Result<std::unique_ptr<ChunkStore>> OpenStore(const std::string& uri, const OpenStoreOptions& options = {});

}  // namespace cachegen
