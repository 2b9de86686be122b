// Internal: stores that answer a prefix lookup in one round trip (the HTTP
// service client) implement this next to ChunkStore; LookupPrefix uses it
// when present instead of one Size() per chunk and level.
#pragma once

#include <span>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/stream.h"

namespace cachegen {

class PrefixLookupProvider {
 public:
  virtual ~PrefixLookupProvider() = default;
  virtual Result<std::vector<CachedChunk>> LookupPrefixBatch(std::span<const ChunkKey> keys, uint32_t levels) = 0;
};

}  // namespace cachegen
