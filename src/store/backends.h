// Internals shared by the store backends: counters and the per-scheme openers
// OpenStore dispatches to.
#pragma once

#include <atomic>
#include <memory>

#include "cachegen/store.h"
#include "store/uri.h"

namespace cachegen::store {

// StoreStats as relaxed atomics, bumped from any thread.
struct StatsCounters {
  std::atomic<uint64_t> puts{0}, hits{0}, misses{0}, corrupt{0}, evictions{0}, bytes_written{0}, bytes_read{0};
  StoreStats Snapshot() const {
    StoreStats s;
    s.puts = puts.load(std::memory_order_relaxed);
    s.hits = hits.load(std::memory_order_relaxed);
    s.misses = misses.load(std::memory_order_relaxed);
    s.corrupt = corrupt.load(std::memory_order_relaxed);
    s.evictions = evictions.load(std::memory_order_relaxed);
    s.bytes_written = bytes_written.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read.load(std::memory_order_relaxed);
    return s;
  }
  static void Add(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }
};

// "<keyhex>/<level>", for messages.
std::string Address(const ChunkKey& key, uint32_t level);

Result<std::unique_ptr<ChunkStore>> OpenMemStore(StoreUri uri);
Result<std::unique_ptr<ChunkStore>> OpenFileStore(StoreUri uri, bool create);
Result<std::unique_ptr<ChunkStore>> OpenRedisStore(StoreUri uri);         // redis://
Result<std::unique_ptr<ChunkStore>> OpenRedisClusterStore(StoreUri uri);  // redis-cluster://

}  // namespace cachegen::store
