// WithMemoryTier (cachegen/store.h): a mem:// LRU in front of another store.
#include <memory>

#include "cachegen/store.h"

namespace cachegen {
namespace {

class MemoryTier final : public ChunkStore {
 public:
  MemoryTier(std::unique_ptr<ChunkStore> front, std::unique_ptr<ChunkStore> back)
      : front_(std::move(front)), back_(std::move(back)) {}

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    const Status to_back = back_ ? back_->Put(key, level, frame) : Status::Ok();
    const Status to_front = front_->Put(key, level, frame);
    // A frame larger than the whole tier is not kept there; with a backing store that is no error.
    return !to_back.ok() ? to_back : back_ ? Status::Ok() : to_front;
  }

  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    return GetWithProgress(key, level, nullptr);
  }

  Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level, const Progress& progress) override {
    Result<std::vector<uint8_t>> held = front_->Get(key, level);
    if (held.ok() || !back_) {
      if (held.ok() && progress) progress(held->size());
      return held;
    }
    Result<std::vector<uint8_t>> fetched = back_->GetWithProgress(key, level, progress);
    if (fetched.ok()) (void)front_->Put(key, level, *fetched);  // too large for the tier: not kept
    return fetched;
  }

  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    Result<uint64_t> held = front_->Size(key, level);
    if (held.ok() || !back_) return held;
    return back_->Size(key, level);
  }

  Status Delete(const ChunkKey& key, uint32_t level) override {
    CG_RETURN_IF_ERROR(front_->Delete(key, level));
    return back_ ? back_->Delete(key, level) : Status::Ok();
  }

  StoreStats stats() const override { return front_->stats(); }
  std::string uri() const override { return front_->uri() + (back_ ? "+" + back_->uri() : ""); }

 private:
  std::unique_ptr<ChunkStore> front_, back_;
};

}  // namespace

std::unique_ptr<ChunkStore> WithMemoryTier(std::unique_ptr<ChunkStore> back, uint64_t max_bytes) {
  Result<std::unique_ptr<ChunkStore>> front = OpenStore("mem://?max_bytes=" + std::to_string(max_bytes));
  return std::make_unique<MemoryTier>(std::move(*front), std::move(back));
}

}  // namespace cachegen
