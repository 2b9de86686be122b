// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads.
// Work is handed out one index at a time from an atomic counter, so uneven
// items balance. threads <= 1 runs inline. The first non-ok Status wins. At
// most 256 threads; where no more can be started, fewer do the work. An
// exception from fn (out of memory) comes back as an Internal status.
#pragma once

#include <cstdint>
#include <functional>

#include "cachegen/status.h"

namespace cachegen {

// 0 means std::thread::hardware_concurrency() (at least 1).
uint32_t ResolveThreads(uint32_t threads);

Status ParallelFor(uint64_t n, uint32_t threads, const std::function<Status(uint64_t)>& fn);

}  // namespace cachegen
