#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace cachegen {

uint32_t ResolveThreads(uint32_t threads) {
  if (threads != 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

Status ParallelFor(uint64_t n, uint32_t threads, const std::function<Status(uint64_t)>& fn) {
  const uint64_t workers = std::min<uint64_t>(ResolveThreads(threads), n);
  if (workers <= 1) {
    for (uint64_t i = 0; i < n; ++i) CG_RETURN_IF_ERROR(fn(i));
    return Status::Ok();
  }
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    for (uint64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.exchange(true)) first_error = std::move(s);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (uint64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return first_error;
}

}  // namespace cachegen
