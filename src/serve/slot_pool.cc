#include "serve/slot_pool.h"

#include <algorithm>

namespace cachegen::serve {

SlotPool::SlotPool(uint32_t slots, uint32_t max_waiting) : slots_(slots), max_waiting_(max_waiting) {
  for (uint32_t i = slots; i-- > 0;) free_.push_back(i);
}

std::optional<uint32_t> SlotPool::Acquire() {
  std::unique_lock lock(mu_);
  if (closed_) return std::nullopt;
  if (queue_.empty() && !free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (queue_.size() >= max_waiting_) return std::nullopt;
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  cv_.wait(lock, [&] { return closed_ || (queue_.front() == ticket && !free_.empty()); });
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  if (closed_) {
    cv_.notify_all();
    return std::nullopt;
  }
  const uint32_t s = free_.back();
  free_.pop_back();
  cv_.notify_all();  // the next ticket may now be at the front with a free slot
  return s;
}

void SlotPool::Release(uint32_t slot) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
  }
  cv_.notify_all();
}

void SlotPool::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

uint32_t SlotPool::busy() const {
  std::lock_guard lock(mu_);
  return slots_ - static_cast<uint32_t>(free_.size());
}

uint32_t SlotPool::waiting() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(queue_.size());
}

}  // namespace cachegen::serve
