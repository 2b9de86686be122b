#include <sys/time.h>

#include <cerrno>
#include <cstring>

#include "store/redis.h"

namespace cachegen::store {
namespace {

timeval Millis(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

// Sends argv on c (no reply read).
int Append(redisContext* c, std::span<const std::string_view> argv) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (std::string_view a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  return redisAppendCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data());
}

Result<ReplyPtr> ReadReply(redisContext* c) {
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) return Status::IOError(c->errstr[0] ? c->errstr : "no reply");
  return ReplyPtr(static_cast<redisReply*>(raw));
}

}  // namespace

RedisNode::RedisNode(std::string host, uint16_t port, RedisOptions options)
    : host_(std::move(host)),
      port_(port),
      name_((host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port)),
      options_(std::move(options)) {}

RedisNode::~RedisNode() {
  for (redisContext* c : idle_) redisFree(c);
}

Result<redisContext*> RedisNode::Connect() {
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, Millis(options_.connect_timeout_ms));
  if (c == nullptr) return Status::IOError("redis " + name_ + ": cannot allocate a connection");
  if (c->err) {
    Status st = Status::IOError("redis " + name_ + ": connect: " + c->errstr);
    redisFree(c);
    return st;
  }
  if (redisSetTimeout(c, Millis(options_.timeout_ms)) != REDIS_OK) {
    redisFree(c);
    return Status::IOError("redis " + name_ + ": cannot set the command timeout");
  }
  redisEnableKeepAlive(c);
  if (!options_.password.empty()) {
    std::vector<std::string_view> auth{"AUTH"};
    if (!options_.user.empty()) auth.push_back(options_.user);
    auth.push_back(options_.password);
    Result<ReplyPtr> r = Append(c, auth) == REDIS_OK ? ReadReply(c) : Result<ReplyPtr>(Status::IOError(c->errstr));
    const bool ok = r.ok() && (*r)->type == REDIS_REPLY_STATUS;
    std::string why = !r.ok() ? r.status().message() : ok ? "" : std::string((*r)->str ? (*r)->str : "refused");
    if (!ok) {
      redisFree(c);
      return Status::IOError("redis " + name_ + ": AUTH failed: " + why);
    }
  }
  return c;
}

void RedisNode::Release(redisContext* c) {
  std::lock_guard lock(mu_);
  if (c->err == 0 && idle_.size() < options_.pool) {
    idle_.push_back(c);
    return;
  }
  redisFree(c);
}

Result<ReplyPtr> RedisNode::Command(std::span<const std::string_view> argv, bool asking) {
  for (int attempt = 0;; ++attempt) {
    redisContext* c = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        c = idle_.back();
        idle_.pop_back();
      }
    }
    const bool pooled = c != nullptr;
    if (!c) {
      CG_ASSIGN_OR_RETURN(c, Connect());
    }
    static constexpr std::string_view kAsking[] = {"ASKING"};
    bool sent = (!asking || Append(c, kAsking) == REDIS_OK) && Append(c, argv) == REDIS_OK;
    Result<ReplyPtr> reply = Status::IOError(c->errstr);
    if (sent && asking) {
      reply = ReadReply(c);  // +OK of ASKING
      sent = reply.ok();
    }
    if (sent) reply = ReadReply(c);
    const int saved_errno = errno;
    if (reply.ok()) {
      Release(c);
      return reply;
    }
    // A pooled connection the server closed (EOF/reset) is worth one retry;
    // a timeout is not (it would only double the wait).
    const bool closed = c->err == REDIS_ERR_EOF ||
                        (c->err == REDIS_ERR_IO && (saved_errno == ECONNRESET || saved_errno == EPIPE));
    // hiredis reports a command timeout as the socket's EAGAIN ("Resource
    // temporarily unavailable"): say what it was.
    const bool timed_out = c->err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK);
    const std::string why = timed_out  ? "timed out after " + std::to_string(options_.timeout_ms) + " ms"
                            : c->errstr[0] ? c->errstr
                                           : reply.status().message();
    redisFree(c);
    if (pooled && closed && attempt == 0) continue;
    return Status::IOError("redis " + name_ + ": " + why);
  }
}

std::string RedisKeyFor(const ChunkKey& key, uint32_t level) {
  return "cg:{" + key.Hex() + "}:" + std::to_string(level);
}

uint16_t KeyHashSlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  uint16_t crc = 0;  // CRC16-XMODEM: polynomial 0x1021, initial value 0, no reflection
  for (unsigned char ch : key) {
    crc ^= static_cast<uint16_t>(ch << 8);
    for (int bit = 0; bit < 8; ++bit) crc = static_cast<uint16_t>(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc & 16383;
}

}  // namespace cachegen::store
