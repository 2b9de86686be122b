// A fixed set of engine slots shared by concurrent requests, with a bounded
// wait queue: a request either gets a slot, waits its turn among at most
// `max_waiting` others, or is refused at once (the server answers 503), so
// load beyond capacity never piles up unbounded.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace cachegen::serve {

class SlotPool {
 public:
  SlotPool(uint32_t slots, uint32_t max_waiting);

  // Returns a free slot index, waiting in FIFO order; std::nullopt when the
  // queue is full or the pool was closed.
  std::optional<uint32_t> Acquire();
  void Release(uint32_t slot);
  // Wakes every waiter with std::nullopt; later Acquire calls fail at once.
  void Close();

  uint32_t busy() const;
  uint32_t waiting() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> free_;
  std::deque<uint64_t> queue_;  // tickets of waiting requests, oldest first
  uint64_t next_ticket_ = 0;
  uint32_t slots_, max_waiting_;
  bool closed_ = false;
};

// Holds a slot for a scope.
class SlotLease {
 public:
  SlotLease(SlotPool& pool, uint32_t slot) : pool_(pool), slot_(slot) {}
  ~SlotLease() { pool_.Release(slot_); }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  uint32_t slot() const { return slot_; }

 private:
  SlotPool& pool_;
  uint32_t slot_;
};

}  // namespace cachegen::serve
