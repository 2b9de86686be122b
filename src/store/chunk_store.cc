// ChunkStore's default answers to the calls a backend may do better.
#include "cachegen/store.h"

namespace cachegen {

Result<std::vector<uint8_t>> ChunkStore::GetWithProgress(const ChunkKey& key, uint32_t level,
                                                         const Progress& progress) {
  Result<std::vector<uint8_t>> got = Get(key, level);
  // Read at once: the whole frame is all there is to report (too late to abandon).
  if (got.ok() && progress) progress(got->size());
  return got;
}

Result<ChunkStore::PrefixSizes> ChunkStore::SizesOfPrefix(std::span<const ChunkKey> keys, uint32_t levels) {
  PrefixSizes out;
  for (const ChunkKey& key : keys) {
    std::vector<uint64_t> sizes(levels, 0);
    bool any = false;
    for (uint32_t l = 0; l < levels; ++l) {
      Result<uint64_t> size = Size(key, l);
      if (size.ok()) {
        sizes[l] = *size;
        any = any || *size > 0;
      } else if (size.status().code() != StatusCode::kNotFound) {
        out.store_error = size.status();
        return out;
      }
    }
    if (!any) break;
    out.level_bytes.push_back(std::move(sizes));
  }
  return out;
}

}  // namespace cachegen
