// mem://[?max_bytes=N]: an in-process LRU of verified records.
#include <list>
#include <map>
#include <mutex>

#include "store/backends.h"
#include "store/record.h"

namespace cachegen::store {
namespace {

class MemStore final : public ChunkStore {
 public:
  MemStore(std::string uri, uint64_t max_bytes) : uri_(std::move(uri)), max_bytes_(max_bytes) {}

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    auto record = std::make_shared<const std::vector<uint8_t>>(EncodeRecord(key, level, frame));
    const uint64_t size = record->size();
    if (max_bytes_ && size > max_bytes_)
      return Status::InvalidArgument("chunk " + Address(key, level) + ": record of " + std::to_string(size) +
                                     " bytes exceeds the store's max_bytes " + std::to_string(max_bytes_));
    std::lock_guard lock(mu_);
    const Addr addr{key, level};
    auto it = entries_.find(addr);
    if (it != entries_.end()) {
      used_ -= it->second.record->size();
      lru_.erase(it->second.lru);
      entries_.erase(it);
    }
    lru_.push_front(addr);
    entries_.emplace(addr, Entry{std::move(record), lru_.begin()});
    used_ += size;
    while (max_bytes_ && used_ > max_bytes_) {
      auto victim = entries_.find(lru_.back());
      used_ -= victim->second.record->size();
      entries_.erase(victim);
      lru_.pop_back();
      StatsCounters::Add(stats_.evictions);
    }
    StatsCounters::Add(stats_.puts);
    StatsCounters::Add(stats_.bytes_written, frame.size());
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    std::shared_ptr<const std::vector<uint8_t>> record;
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(Addr{key, level});
      if (it != entries_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        record = it->second.record;
      }
    }
    if (!record) {
      StatsCounters::Add(stats_.misses);
      return Status::NotFound("chunk " + Address(key, level) + " not in store");
    }
    auto payload = OpenRecord(*record, key, level);
    if (!payload.ok()) {  // only if memory itself was corrupted
      StatsCounters::Add(stats_.misses);
      StatsCounters::Add(stats_.corrupt);
      return Status::NotFound("chunk " + Address(key, level) + ": " + payload.status().message());
    }
    StatsCounters::Add(stats_.hits);
    StatsCounters::Add(stats_.bytes_read, payload->size());
    return std::vector<uint8_t>(payload->begin(), payload->end());
  }

  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    std::lock_guard lock(mu_);
    auto it = entries_.find(Addr{key, level});
    if (it == entries_.end()) return Status::NotFound("chunk " + Address(key, level) + " not in store");
    return uint64_t{it->second.record->size() - kRecordHeaderSize};
  }

  Status Delete(const ChunkKey& key, uint32_t level) override {
    std::lock_guard lock(mu_);
    auto it = entries_.find(Addr{key, level});
    if (it != entries_.end()) {
      used_ -= it->second.record->size();
      lru_.erase(it->second.lru);
      entries_.erase(it);
    }
    return Status::Ok();
  }

  StoreStats stats() const override {
    StoreStats s = stats_.Snapshot();
    std::lock_guard lock(mu_);
    s.held_bytes = used_;
    s.held_frames = entries_.size();
    return s;
  }
  std::string uri() const override { return uri_; }

 private:
  using Addr = std::pair<ChunkKey, uint32_t>;
  struct Entry {
    std::shared_ptr<const std::vector<uint8_t>> record;
    std::list<Addr>::iterator lru;
  };
  const std::string uri_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<Addr, Entry> entries_;
  std::list<Addr> lru_;  // most recently used first
  uint64_t used_ = 0;    // record bytes held
  StatsCounters stats_;
};

}  // namespace

Result<std::unique_ptr<ChunkStore>> OpenMemStore(StoreUri uri) {
  if (!uri.authority.empty() || !uri.userinfo.empty() || !uri.path.empty())
    return Status::InvalidArgument("store URI '" + uri.Redacted() + "': mem:// takes no host or path (mem://?max_bytes=N)");
  CG_ASSIGN_OR_RETURN(const uint64_t max_bytes, uri.TakeSize("max_bytes", 0));
  CG_RETURN_IF_ERROR(uri.CheckNoneLeft());
  return std::unique_ptr<ChunkStore>(new MemStore(uri.text, max_bytes));
}

}  // namespace cachegen::store
