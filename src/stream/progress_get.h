// Internal: stores whose reads take long enough to watch and abandon (the
// HTTP service client) implement this next to ChunkStore. StreamClient uses
// it, when present, to measure the link while frames arrive (not only when
// they complete) and to abandon a request it re-issues at a coarser level.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen {

class ProgressGetProvider {
 public:
  // Called as bytes arrive, with the frame bytes received so far; returning
  // false abandons the read (Get then returns kIOError "cancelled").
  using Progress = std::function<bool(uint64_t received)>;
  virtual ~ProgressGetProvider() = default;
  // Get (same checks and answers) reporting progress.
  virtual Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level,
                                                       const Progress& progress) = 0;
};

}  // namespace cachegen
