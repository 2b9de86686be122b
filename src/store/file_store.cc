#include "store/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "store/record.h"

namespace cachegen::store {
namespace {

// Largest record a Get reads (a frame is bounded far below this by the format).
constexpr uint64_t kMaxRecordBytes = uint64_t{4} << 30;
// A temp file whose writer pid still exists is removed only after this long.
constexpr int64_t kStaleTempSeconds = 3600;
constexpr char kTempPrefix[] = ".tmp-";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string FanoutName(uint8_t b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return {kDigits[b >> 4], kDigits[b & 15]};
}

int64_t MtimeNs(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

void SaturatingSub(std::atomic<uint64_t>& v, uint64_t n) {
  uint64_t cur = v.load(std::memory_order_relaxed);
  while (!v.compare_exchange_weak(cur, cur > n ? cur - n : 0, std::memory_order_relaxed)) {
  }
}

Status WriteAll(int fd, std::span<const uint8_t> data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(Errno("write"));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads the whole file behind `fd` (at most kMaxRecordBytes + 1 bytes, so an
// oversized file fails verification instead of exhausting memory).
Status ReadAll(int fd, std::vector<uint8_t>* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError(Errno("fstat"));
  const uint64_t want = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), kMaxRecordBytes + 1);
  out->resize(want);
  size_t done = 0;
  while (done < want) {
    const ssize_t n = ::pread(fd, out->data() + done, want - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(Errno("read"));
    }
    if (n == 0) break;  // shrank under us: verification reports it
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return Status::Ok();
}

// "<32 hex>.<level>" with the key's canonical lowercase spelling; false otherwise.
bool ParseChunkFileName(const std::string& name, ChunkKey* key, uint32_t* level) {
  constexpr size_t kHex = 32;
  if (name.size() < kHex + 2 || name[kHex] != '.') return false;
  const std::string digits = name.substr(kHex + 1);
  if (digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  if (digits.size() > 1 && digits[0] == '0') return false;
  const uint64_t lv = std::stoull(digits);
  if (lv > UINT32_MAX) return false;
  auto k = ChunkKey::FromHex(std::string_view(name).substr(0, kHex));
  if (!k.ok() || k->Hex() != name.substr(0, kHex)) return false;
  *key = *k;
  *level = static_cast<uint32_t>(lv);
  return true;
}

// Whether the writer of temp file ".tmp-<pid>-..." may still be running.
bool TempWriterAlive(const std::string& name) {
  const size_t start = sizeof(kTempPrefix) - 1;
  const size_t dash = name.find('-', start);
  if (dash == std::string::npos || dash == start || dash - start > 9) return false;
  const std::string pid = name.substr(start, dash - start);
  if (pid.find_first_not_of("0123456789") != std::string::npos) return false;
  return ::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno == EPERM;
}

}  // namespace

FileStore::FileStore(std::string root, uint64_t max_bytes, std::string uri)
    : root_(std::move(root)), max_bytes_(max_bytes), uri_(std::move(uri)) {
  for (auto& fd : dir_fds_) fd.store(-1);
}

FileStore::~FileStore() {
  for (auto& fd : dir_fds_)
    if (fd.load() >= 0) ::close(fd.load());
  if (root_fd_ >= 0) ::close(root_fd_);
}

Result<std::unique_ptr<FileStore>> FileStore::Open(const std::string& root, uint64_t max_bytes, std::string uri,
                                                   bool create) {
  std::error_code ec;
  if (!create) {
    if (!std::filesystem::is_directory(root, ec)) return Status::NotFound("no store at '" + root + "'");
  } else {
    std::filesystem::create_directories(root, ec);
    if (ec) return Status::IOError("store directory " + root + ": " + ec.message());
  }
  std::unique_ptr<FileStore> s(new FileStore(root, max_bytes, std::move(uri)));
  s->root_fd_ = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s->root_fd_ < 0) return Status::IOError(Errno("store directory " + root));
  CG_ASSIGN_OR_RETURN(const ScanResult scan, s->Scan(/*remove_stale_temps=*/true));
  s->used_.store(scan.total_bytes);
  return s;
}

std::string FileStore::FileName(const ChunkKey& key, uint32_t level) const {
  return key.Hex() + "." + std::to_string(level);
}

Result<int> FileStore::DirFd(uint8_t fanout, bool create) {
  int fd = dir_fds_[fanout].load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  std::lock_guard lock(dir_mu_);
  fd = dir_fds_[fanout].load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  const std::string name = FanoutName(fanout);
  fd = ::openat(root_fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    if (!create) return Status::NotFound("no directory " + name);
    if (::mkdirat(root_fd_, name.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::IOError(Errno("mkdir " + root_ + "/" + name));
    if (::fsync(root_fd_) != 0) return Status::IOError(Errno("fsync " + root_));
    fd = ::openat(root_fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0) return Status::IOError(Errno("open " + root_ + "/" + name));
  dir_fds_[fanout].store(fd, std::memory_order_release);
  return fd;
}

Status FileStore::Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) {
  const std::vector<uint8_t> record = EncodeRecord(key, level, frame);
  if (max_bytes_ && record.size() > max_bytes_)
    return Status::InvalidArgument("chunk " + Address(key, level) + ": record of " + std::to_string(record.size()) +
                                   " bytes exceeds the store's max_bytes " + std::to_string(max_bytes_));
  CG_ASSIGN_OR_RETURN(const int dfd, DirFd(key.bytes[0], true));
  const std::string name = FileName(key, level);
  const std::string tmp = std::string(kTempPrefix) + std::to_string(::getpid()) + "-" +
                          std::to_string(temp_seq_.fetch_add(1)) + "-" + name;
  const std::string where = root_ + "/" + FanoutName(key.bytes[0]) + "/";
  const int fd = ::openat(dfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(Errno("create " + where + tmp));
  Status st = WriteAll(fd, record);
  if (st.ok() && ::fsync(fd) != 0) st = Status::IOError(Errno("fsync " + where + tmp));
  if (::close(fd) != 0 && st.ok()) st = Status::IOError(Errno("close " + where + tmp));
  struct stat old;
  const bool replaced = st.ok() && ::fstatat(dfd, name.c_str(), &old, 0) == 0;
  if (st.ok() && ::renameat(dfd, tmp.c_str(), dfd, name.c_str()) != 0)
    st = Status::IOError(Errno("rename to " + where + name));
  if (!st.ok()) {
    ::unlinkat(dfd, tmp.c_str(), 0);
    return st;
  }
  if (::fsync(dfd) != 0) return Status::IOError(Errno("fsync " + where));
  used_.fetch_add(record.size(), std::memory_order_relaxed);
  if (replaced) SaturatingSub(used_, static_cast<uint64_t>(old.st_size));
  StatsCounters::Add(stats_.puts);
  StatsCounters::Add(stats_.bytes_written, frame.size());
  if (max_bytes_ && used_.load(std::memory_order_relaxed) > max_bytes_)
    Evict(FanoutName(key.bytes[0]) + "/" + name);
  return Status::Ok();
}

Result<std::vector<uint8_t>> FileStore::Get(const ChunkKey& key, uint32_t level) {
  const auto miss = [&](Status st) -> Result<std::vector<uint8_t>> {
    StatsCounters::Add(stats_.misses);
    return st;
  };
  auto dfd = DirFd(key.bytes[0], false);
  if (!dfd.ok()) {
    if (dfd.status().code() == StatusCode::kNotFound)
      return miss(Status::NotFound("chunk " + Address(key, level) + " not in store"));
    return miss(dfd.status());
  }
  const std::string name = FileName(key, level);
  const int fd = ::openat(*dfd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return miss(Status::NotFound("chunk " + Address(key, level) + " not in store"));
    return miss(Status::IOError(Errno("open " + root_ + "/" + FanoutName(key.bytes[0]) + "/" + name)));
  }
  std::vector<uint8_t> record;
  const Status st = ReadAll(fd, &record);
  if (!st.ok()) {
    ::close(fd);
    return miss(st);
  }
  auto payload = OpenRecord(record, key, level);
  if (!payload.ok()) {
    // Removed, so that Size (HEAD, lookups) stops listing a level no read can
    // return. Only the file read (same inode): a Put may rename a sound record
    // over the name at any time; one landing between the check and the unlink
    // is lost from the cache, and a later put stores it again.
    struct stat read_st, now_st;
    if (::fstat(fd, &read_st) == 0 && ::fstatat(*dfd, name.c_str(), &now_st, 0) == 0 &&
        read_st.st_ino == now_st.st_ino && read_st.st_dev == now_st.st_dev)
      ::unlinkat(*dfd, name.c_str(), 0);
    ::close(fd);
    StatsCounters::Add(stats_.corrupt);
    return miss(Status::NotFound("chunk " + Address(key, level) + ": " + payload.status().message()));
  }
  ::futimens(fd, nullptr);  // last use, for LRU; best effort
  ::close(fd);
  StatsCounters::Add(stats_.hits);
  StatsCounters::Add(stats_.bytes_read, payload->size());
  return std::vector<uint8_t>(payload->begin(), payload->end());
}

Result<uint64_t> FileStore::Size(const ChunkKey& key, uint32_t level) {
  auto dfd = DirFd(key.bytes[0], false);
  struct stat st;
  if (!dfd.ok() || ::fstatat(*dfd, FileName(key, level).c_str(), &st, 0) != 0 ||
      static_cast<uint64_t>(st.st_size) < kRecordHeaderSize)
    return Status::NotFound("chunk " + Address(key, level) + " not in store");
  return static_cast<uint64_t>(st.st_size) - kRecordHeaderSize;
}

Status FileStore::Delete(const ChunkKey& key, uint32_t level) {
  auto dfd = DirFd(key.bytes[0], false);
  if (!dfd.ok()) return dfd.status().code() == StatusCode::kNotFound ? Status::Ok() : dfd.status();
  const std::string name = FileName(key, level);
  struct stat st;
  const bool present = ::fstatat(*dfd, name.c_str(), &st, 0) == 0;
  if (::unlinkat(*dfd, name.c_str(), 0) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IOError(Errno("unlink " + root_ + "/" + FanoutName(key.bytes[0]) + "/" + name));
  }
  if (present) SaturatingSub(used_, static_cast<uint64_t>(st.st_size));
  return Status::Ok();
}

Result<FileStore::ScanResult> FileStore::Scan(bool remove_stale_temps) const {
  ScanResult out;
  const int64_t now_s = static_cast<int64_t>(std::time(nullptr));
  for (int b = 0; b < 256; ++b) {
    const std::string dname = FanoutName(static_cast<uint8_t>(b));
    const int dfd = ::openat(root_fd_, dname.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) continue;
      return Status::IOError(Errno("open " + root_ + "/" + dname));
    }
    DIR* dir = ::fdopendir(dfd);
    if (!dir) {
      ::close(dfd);
      return Status::IOError(Errno("opendir " + root_ + "/" + dname));
    }
    while (const dirent* de = ::readdir(dir)) {
      const std::string name = de->d_name;
      struct stat st;
      if (name.rfind(kTempPrefix, 0) == 0) {
        ++out.temp_files;
        if (remove_stale_temps && ::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode) && (!TempWriterAlive(name) || now_s - st.st_mtim.tv_sec > kStaleTempSeconds) &&
            ::unlinkat(dfd, name.c_str(), 0) == 0)
          ++out.temps_removed;
        continue;
      }
      Entry e;
      if (!ParseChunkFileName(name, &e.key, &e.level) || e.key.bytes[0] != b) continue;
      if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
      e.path = dname + "/" + name;
      e.size = static_cast<uint64_t>(st.st_size);
      e.mtime_ns = MtimeNs(st);
      out.total_bytes += e.size;
      out.entries.push_back(std::move(e));
    }
    ::closedir(dir);  // closes dfd
  }
  return out;
}

Status FileStore::VerifyEntry(const Entry& e, std::vector<uint8_t>* payload) const {
  const int fd = ::openat(root_fd_, e.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Errno("open " + root_ + "/" + e.path));
  std::vector<uint8_t> record;
  const Status st = ReadAll(fd, &record);
  ::close(fd);
  CG_RETURN_IF_ERROR(st);
  CG_ASSIGN_OR_RETURN(const std::span<const uint8_t> stored, OpenRecord(record, e.key, e.level));
  if (payload) payload->assign(stored.begin(), stored.end());
  return Status::Ok();
}

void FileStore::Evict(const std::string& keep) {
  std::unique_lock lock(evict_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread is already evicting
  auto scan = Scan(false);
  if (!scan.ok()) return;
  uint64_t total = scan->total_bytes;
  if (total > max_bytes_) {
    const uint64_t target = max_bytes_ - max_bytes_ / 10;
    auto& entries = scan->entries;
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
    });
    for (const Entry& e : entries) {
      if (total <= target) break;
      if (e.path == keep) continue;
      if (::unlinkat(root_fd_, e.path.c_str(), 0) == 0) {
        StatsCounters::Add(stats_.evictions);
        total -= e.size;
      } else if (errno == ENOENT) {
        total -= e.size;  // someone else removed it
      }
    }
  }
  used_.store(total, std::memory_order_relaxed);
}

Result<std::unique_ptr<ChunkStore>> OpenFileStore(StoreUri uri, bool create) {
  if (!uri.authority.empty() || !uri.userinfo.empty() || uri.path.empty())
    return Status::InvalidArgument("store URI '" + uri.Redacted() +
                                   "': file:// needs an absolute path, as file:///abs/path");
  CG_ASSIGN_OR_RETURN(const uint64_t max_bytes, uri.TakeSize("max_bytes", 0));
  CG_RETURN_IF_ERROR(uri.CheckNoneLeft());
  CG_ASSIGN_OR_RETURN(auto store, FileStore::Open(uri.path, max_bytes, uri.text, create));
  return std::unique_ptr<ChunkStore>(std::move(store));
}

}  // namespace cachegen::store
