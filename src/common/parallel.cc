#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

namespace cachegen {
namespace {

// More threads than this only cost memory and start-up: every caller's work
// is far from that parallel.
constexpr uint64_t kMaxWorkers = 256;

// fn(i), with an exception (allocation failure above all) as a Status: none
// may escape a worker thread (std::terminate) or cross the C API.
Status Guarded(const std::function<Status(uint64_t)>& fn, uint64_t i) {
  try {
    return fn(i);
  } catch (const std::bad_alloc&) {
    return Status::Internal("out of memory");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("unexpected exception: ") + e.what());
  }
}

}  // namespace

uint32_t ResolveThreads(uint32_t threads) {
  if (threads != 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

Status ParallelFor(uint64_t n, uint32_t threads, const std::function<Status(uint64_t)>& fn) {
  const uint64_t workers = std::min<uint64_t>({ResolveThreads(threads), n, kMaxWorkers});
  if (workers <= 1) {
    for (uint64_t i = 0; i < n; ++i) CG_RETURN_IF_ERROR(Guarded(fn, i));
    return Status::Ok();
  }
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    for (uint64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      Status s = Guarded(fn, i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.exchange(true)) first_error = std::move(s);
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    pool.reserve(workers - 1);
    for (uint64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  } catch (const std::system_error&) {  // no more threads: those started and this one do the work
  } catch (const std::bad_alloc&) {
  }
  work();
  for (auto& t : pool) t.join();
  return first_error;
}

}  // namespace cachegen
