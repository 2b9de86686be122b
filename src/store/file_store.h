// file:///root[?max_bytes=N]: the embedded store, one file per chunk-level.
//
// Layout: root/<first two hex digits of the key>/<32 hex digits>.<level>,
// each file one store record (store/record.h). A Put writes
// root/<xx>/.tmp-<pid>-<n>-<name>, fsyncs it, renames it over the final name
// and fsyncs the directory, so readers (threads or processes) see the old
// record or the new one, and a crash leaves at most a temp file, which the
// next open removes once its writer's pid is gone (or after an hour).
//
// Size budget (max_bytes > 0, counted in record bytes): a file's mtime is its
// last use (set when written, touched on every verified read), so LRU order
// survives restarts and is shared by every process using the directory. When
// a process's running total (scanned on open, plus its own puts) exceeds the
// budget, it rescans the directory and removes the least recently used files
// until the total is at most 90% of the budget. With several writer processes
// the directory can exceed the budget by what the others wrote since this
// process last scanned.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cachegen/store.h"
#include "store/backends.h"

namespace cachegen::store {

class FileStore final : public ChunkStore {
 public:
  // Creates `root` (and parents) when missing; removes stale temp files.
  // create = false: a missing root is kNotFound (OpenStoreOptions::create).
  static Result<std::unique_ptr<FileStore>> Open(const std::string& root, uint64_t max_bytes, std::string uri,
                                                 bool create = true);
  ~FileStore() override;

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override;
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override;
  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override;
  Status Delete(const ChunkKey& key, uint32_t level) override;
  StoreStats stats() const override { return stats_.Snapshot(); }
  std::string uri() const override { return uri_; }

  struct Entry {
    std::string path;  // relative to root: "<xx>/<hex>.<level>"
    ChunkKey key;
    uint32_t level = 0;
    uint64_t size = 0;      // record bytes on disk
    int64_t mtime_ns = 0;   // last use
  };
  struct ScanResult {
    std::vector<Entry> entries;
    uint64_t total_bytes = 0;
    uint64_t temp_files = 0;     // in-flight or stale temp files seen
    uint64_t temps_removed = 0;  // stale ones removed (only when asked)
  };
  // Lists every chunk file (names that do not match the layout are ignored).
  Result<ScanResult> Scan(bool remove_stale_temps) const;

  // Reads and verifies one entry found by Scan (name, record and address):
  // ok, or the reason it is corrupt; the stored bytes to *payload when
  // given. Does not touch its mtime.
  Status VerifyEntry(const Entry& e, std::vector<uint8_t>* payload = nullptr) const;

  const std::string& root() const { return root_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  FileStore(std::string root, uint64_t max_bytes, std::string uri);
  Result<int> DirFd(uint8_t fanout, bool create);
  std::string FileName(const ChunkKey& key, uint32_t level) const;
  void Evict(const std::string& keep);

  const std::string root_;
  const uint64_t max_bytes_;
  const std::string uri_;
  int root_fd_ = -1;
  std::mutex dir_mu_;
  std::array<std::atomic<int>, 256> dir_fds_;
  std::atomic<uint64_t> used_{0};   // estimate of record bytes in the directory
  std::atomic<uint64_t> temp_seq_{0};
  std::mutex evict_mu_;
  StatsCounters stats_;
};

}  // namespace cachegen::store
