// Redis plumbing shared by the redis:// and redis-cluster:// stores: a pool of
// hiredis connections to one server, and Redis Cluster key hashing.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen::store {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

struct RedisOptions {
  int connect_timeout_ms = 1000;
  int timeout_ms = 2000;     // per command (send + reply)
  size_t pool = 8;           // idle connections kept per server
  std::string user, password;  // AUTH [user] password on connect when password is set
};

// Connections to one Redis server, shared by any number of threads: each
// command takes an idle connection (or opens one), and returns it when the
// exchange succeeded.
class RedisNode {
 public:
  RedisNode(std::string host, uint16_t port, RedisOptions options);
  ~RedisNode();
  RedisNode(const RedisNode&) = delete;
  RedisNode& operator=(const RedisNode&) = delete;

  // Sends `argv` (preceded by ASKING when `asking`) and returns the reply,
  // which may be a Redis error reply. kIOError ("redis HOST:PORT: why") when
  // the server cannot be reached or does not answer within the timeouts; a
  // pooled connection found closed is retried once on a fresh one.
  Result<ReplyPtr> Command(std::span<const std::string_view> argv, bool asking = false);

  const std::string& name() const { return name_; }  // "host:port"
  const std::string& host() const { return host_; }

 private:
  Result<redisContext*> Connect();
  void Release(redisContext* c);

  const std::string host_;
  const uint16_t port_;
  const std::string name_;
  const RedisOptions options_;
  std::mutex mu_;
  std::vector<redisContext*> idle_;
};

// Redis key of a chunk-level: "cg:{<32 hex>}:<level>". The hash tag keeps all
// levels of a chunk in one Redis Cluster slot.
std::string RedisKeyFor(const ChunkKey& key, uint32_t level);

// Redis Cluster hash slot (CRC16-XMODEM mod 16384) of `key`, honouring a
// non-empty {hash tag}.
uint16_t KeyHashSlot(std::string_view key);

}  // namespace cachegen::store
