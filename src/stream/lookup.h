// Internal: stores that answer a prefix lookup in one round trip (the HTTP
// service client) implement this next to ChunkStore; LookupPrefix uses it
// when present instead of one Size() per chunk and level.
#pragma once

#include <span>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/stream.h"

namespace cachegen {

// What a batch lookup answered: the usable prefix, and why it ended early
// where the store behind could not answer (ok: it ended at a miss or at the
// last key).
struct PrefixLookup {
  std::vector<CachedChunk> chunks;
  Status store_error;
};

class PrefixLookupProvider {
 public:
  virtual ~PrefixLookupProvider() = default;
  // Non-ok when the lookup itself failed (unreachable, malformed answer).
  virtual Result<PrefixLookup> LookupPrefixBatch(std::span<const ChunkKey> keys, uint32_t levels) = 0;
};

}  // namespace cachegen
