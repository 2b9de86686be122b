// redis://host:port and redis-cluster://h1:p1,h2:p2 stores: one store record
// per Redis string value, key "cg:{<keyhex>}:<level>".
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <shared_mutex>
#include <thread>

#include "store/backends.h"
#include "store/record.h"
#include "store/redis.h"

namespace cachegen::store {
namespace {

std::string ReplyText(const redisReply* r) { return r->str ? std::string(r->str, r->len) : std::string(); }

// Put/Get/Size/Delete over Redis commands; subclasses route each command.
class RedisStoreBase : public ChunkStore {
 public:
  RedisStoreBase(std::string uri, uint64_t ttl_s) : uri_(std::move(uri)), ttl_(std::to_string(ttl_s)), has_ttl_(ttl_s > 0) {}

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    const std::string rkey = RedisKeyFor(key, level);
    const std::vector<uint8_t> record = EncodeRecord(key, level, frame);
    const std::string_view value(reinterpret_cast<const char*>(record.data()), record.size());
    std::vector<std::string_view> argv{"SET", rkey, value};
    if (has_ttl_) argv.insert(argv.end(), {"EX", ttl_});
    CG_ASSIGN_OR_RETURN(const ReplyPtr r, Run(rkey, argv));
    if (r->type != REDIS_REPLY_STATUS)
      return Status::IOError("redis SET " + rkey + ": " + (r->type == REDIS_REPLY_ERROR ? ReplyText(r.get()) : "unexpected reply"));
    StatsCounters::Add(stats_.puts);
    StatsCounters::Add(stats_.bytes_written, frame.size());
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    const std::string rkey = RedisKeyFor(key, level);
    const std::string_view argv[] = {"GET", rkey};
    auto r = Run(rkey, argv);
    if (r.ok() && (*r)->type == REDIS_REPLY_STRING) {
      const auto* data = reinterpret_cast<const uint8_t*>((*r)->str);
      auto payload = OpenRecord(std::span(data, (*r)->len), key, level);
      if (payload.ok()) {
        StatsCounters::Add(stats_.hits);
        StatsCounters::Add(stats_.bytes_read, payload->size());
        return std::vector<uint8_t>(payload->begin(), payload->end());
      }
      StatsCounters::Add(stats_.corrupt);
      StatsCounters::Add(stats_.misses);
      return Status::NotFound("chunk " + Address(key, level) + ": " + payload.status().message());
    }
    StatsCounters::Add(stats_.misses);
    if (!r.ok()) return r.status();
    if ((*r)->type == REDIS_REPLY_NIL) return Status::NotFound("chunk " + Address(key, level) + " not in store");
    return Status::IOError("redis GET " + rkey + ": " +
                           ((*r)->type == REDIS_REPLY_ERROR ? ReplyText(r->get()) : "unexpected reply"));
  }

  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    const std::string rkey = RedisKeyFor(key, level);
    const std::string_view argv[] = {"STRLEN", rkey};
    CG_ASSIGN_OR_RETURN(const ReplyPtr r, Run(rkey, argv));
    if (r->type != REDIS_REPLY_INTEGER)
      return Status::IOError("redis STRLEN " + rkey + ": " + (r->type == REDIS_REPLY_ERROR ? ReplyText(r.get()) : "unexpected reply"));
    if (r->integer < static_cast<long long>(kRecordHeaderSize))  // 0: absent
      return Status::NotFound("chunk " + Address(key, level) + " not in store");
    return static_cast<uint64_t>(r->integer) - kRecordHeaderSize;
  }

  Status Delete(const ChunkKey& key, uint32_t level) override {
    const std::string rkey = RedisKeyFor(key, level);
    const std::string_view argv[] = {"DEL", rkey};
    CG_ASSIGN_OR_RETURN(const ReplyPtr r, Run(rkey, argv));
    if (r->type != REDIS_REPLY_INTEGER)
      return Status::IOError("redis DEL " + rkey + ": " + (r->type == REDIS_REPLY_ERROR ? ReplyText(r.get()) : "unexpected reply"));
    return Status::Ok();
  }

  StoreStats stats() const override { return stats_.Snapshot(); }
  std::string uri() const override { return uri_; }

 protected:
  // Sends argv (about `key`) to the server that holds `key`.
  virtual Result<ReplyPtr> Run(const std::string& key, std::span<const std::string_view> argv) = 0;

 private:
  const std::string uri_;
  const std::string ttl_;
  const bool has_ttl_;
  StatsCounters stats_;
};

class RedisStore final : public RedisStoreBase {
 public:
  RedisStore(std::string uri, uint64_t ttl_s, const HostPort& hp, RedisOptions options)
      : RedisStoreBase(std::move(uri), ttl_s), node_(hp.host, hp.port, std::move(options)) {}

  Status Ping() {
    const std::string_view argv[] = {"PING"};
    CG_ASSIGN_OR_RETURN(const ReplyPtr r, node_.Command(argv));
    if (r->type == REDIS_REPLY_ERROR) return Status::IOError("redis " + node_.name() + ": PING: " + ReplyText(r.get()));
    return Status::Ok();
  }

 protected:
  Result<ReplyPtr> Run(const std::string&, std::span<const std::string_view> argv) override {
    CG_ASSIGN_OR_RETURN(ReplyPtr r, node_.Command(argv));
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string text = ReplyText(r.get());
      if (text.rfind("MOVED ", 0) == 0 || text.rfind("ASK ", 0) == 0)
        return Status::IOError("redis " + node_.name() + " is a cluster node (" + text + "); use redis-cluster://");
    }
    return r;
  }

 private:
  RedisNode node_;
};

// Redis Cluster: slots routed from CLUSTER SLOTS, MOVED updates the map (and
// triggers a refresh), ASK is followed once with ASKING, connection failures
// schedule a refresh (a failover may have moved the slot) and are reported.
class RedisClusterStore final : public RedisStoreBase {
 public:
  static constexpr int kSlots = 16384;
  static constexpr int kMaxRedirects = 5;

  RedisClusterStore(std::string uri, uint64_t ttl_s, std::vector<HostPort> seeds, RedisOptions options)
      : RedisStoreBase(std::move(uri), ttl_s), seeds_(std::move(seeds)), options_(std::move(options)) {
    slots_.fill(nullptr);
  }

  // Loads the slot map from the first seed (or known node) that answers.
  // Calls closer than kRefreshInterval to the last one do nothing unless forced.
  Status Refresh(bool force) {
    std::unique_lock lock(refresh_mu_, std::defer_lock);
    if (force) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return Status::Ok();  // another thread is refreshing
    }
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_refresh_ < kRefreshInterval) return Status::Ok();
    last_refresh_ = now;
    std::vector<RedisNode*> candidates;
    for (const HostPort& s : seeds_) candidates.push_back(NodeAt(s.host, s.port));
    {
      std::lock_guard nl(nodes_mu_);
      for (auto& [name, node] : nodes_)
        if (std::find(candidates.begin(), candidates.end(), node.get()) == candidates.end())
          candidates.push_back(node.get());
    }
    std::string errors;
    for (RedisNode* n : candidates) {
      auto map = LoadSlots(n);
      if (map.ok()) {
        std::unique_lock ml(map_mu_);
        slots_ = *map;
        return Status::Ok();
      }
      errors += (errors.empty() ? "" : "; ") + map.status().message();
    }
    return Status::IOError("redis-cluster: no node answered CLUSTER SLOTS (" + errors + ")");
  }

 protected:
  Result<ReplyPtr> Run(const std::string& key, std::span<const std::string_view> argv) override {
    const uint16_t slot = KeyHashSlot(key);
    RedisNode* node = SlotNode(slot);
    if (!node) {
      (void)Refresh(false);
      node = SlotNode(slot);
      if (!node) return Status::IOError("redis-cluster: no node serves hash slot " + std::to_string(slot));
    }
    bool asking = false;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      auto r = node->Command(argv, asking);
      if (!r.ok()) {
        (void)Refresh(false);  // a failover may have moved the slot; this command still fails
        return Status::IOError("redis-cluster slot " + std::to_string(slot) + ": " + r.status().message());
      }
      asking = false;
      if ((*r)->type != REDIS_REPLY_ERROR) return r;
      const std::string text = ReplyText(r->get());
      const bool moved = text.rfind("MOVED ", 0) == 0, ask = text.rfind("ASK ", 0) == 0;
      if (moved || ask) {
        // "MOVED <slot> <host>:<port>"
        const size_t sp = text.rfind(' ');
        const std::string addr = text.substr(sp + 1);
        const size_t colon = addr.rfind(':');
        if (sp == std::string::npos || colon == std::string::npos)
          return Status::IOError("redis-cluster: malformed redirect '" + text + "'");
        auto port = std::strtoul(addr.c_str() + colon + 1, nullptr, 10);
        std::string host = addr.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        if (host.empty()) host = node->host();
        if (port == 0 || port > 65535) return Status::IOError("redis-cluster: malformed redirect '" + text + "'");
        node = NodeAt(host, static_cast<uint16_t>(port));
        if (moved) {
          {
            std::unique_lock ml(map_mu_);
            slots_[slot] = node;
          }
          (void)Refresh(false);  // more slots probably moved with it
        } else {
          asking = true;
        }
        continue;
      }
      if (text.rfind("TRYAGAIN", 0) == 0) {  // multi-key op during resharding; back off briefly
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      return r;  // other errors (CLUSTERDOWN, OOM...) are the caller's to report
    }
    return Status::IOError("redis-cluster slot " + std::to_string(slot) + ": more than " +
                           std::to_string(kMaxRedirects) + " redirects");
  }

 private:
  static constexpr auto kRefreshInterval = std::chrono::milliseconds(250);

  RedisNode* SlotNode(uint16_t slot) {
    std::shared_lock ml(map_mu_);
    return slots_[slot];
  }

  // The node for host:port (created on first use; nodes live as long as the store).
  RedisNode* NodeAt(const std::string& host, uint16_t port) {
    const std::string name = host + ":" + std::to_string(port);
    std::lock_guard lock(nodes_mu_);
    auto& slot = nodes_[name];
    if (!slot) slot = std::make_unique<RedisNode>(host, port, options_);
    return slot.get();
  }

  Result<std::array<RedisNode*, kSlots>> LoadSlots(RedisNode* from) {
    const std::string_view argv[] = {"CLUSTER", "SLOTS"};
    CG_ASSIGN_OR_RETURN(const ReplyPtr r, from->Command(argv));
    if (r->type == REDIS_REPLY_ERROR)
      return Status::IOError("redis " + from->name() + ": CLUSTER SLOTS: " + ReplyText(r.get()));
    if (r->type != REDIS_REPLY_ARRAY) return Status::IOError("redis " + from->name() + ": CLUSTER SLOTS: unexpected reply");
    std::array<RedisNode*, kSlots> map;
    map.fill(nullptr);
    size_t covered = 0;
    for (size_t i = 0; i < r->elements; ++i) {
      // [start, end, [host, port, id, ...], replicas...]
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
          e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
          e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
        return Status::IOError("redis " + from->name() + ": CLUSTER SLOTS: malformed entry");
      const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
      const long long port = e->element[2]->element[1]->integer;
      if (lo < 0 || hi >= kSlots || lo > hi || port <= 0 || port > 65535)
        return Status::IOError("redis " + from->name() + ": CLUSTER SLOTS: bad range or port");
      std::string host = ReplyText(e->element[2]->element[0]);
      if (host.empty() || host == "?") host = from->host();
      RedisNode* n = NodeAt(host, static_cast<uint16_t>(port));
      for (long long s = lo; s <= hi; ++s) map[static_cast<size_t>(s)] = n;
      covered += static_cast<size_t>(hi - lo + 1);
    }
    if (covered == 0) return Status::IOError("redis " + from->name() + ": CLUSTER SLOTS: no slots assigned");
    return map;
  }

  const std::vector<HostPort> seeds_;
  const RedisOptions options_;
  std::mutex nodes_mu_;
  std::map<std::string, std::unique_ptr<RedisNode>> nodes_;
  std::shared_mutex map_mu_;
  std::array<RedisNode*, kSlots> slots_;
  std::mutex refresh_mu_;
  std::chrono::steady_clock::time_point last_refresh_{};
};

Result<RedisOptions> TakeOptions(StoreUri& uri, uint64_t* ttl) {
  RedisOptions o;
  CG_ASSIGN_OR_RETURN(*ttl, uri.TakeUInt("ttl", 0));
  CG_ASSIGN_OR_RETURN(const uint64_t connect_ms, uri.TakeUInt("connect_timeout_ms", 1000));
  CG_ASSIGN_OR_RETURN(const uint64_t timeout_ms, uri.TakeUInt("timeout_ms", 2000));
  CG_ASSIGN_OR_RETURN(const uint64_t pool, uri.TakeUInt("pool", 8));
  CG_RETURN_IF_ERROR(uri.CheckNoneLeft());
  if (connect_ms == 0 || connect_ms > 600000 || timeout_ms == 0 || timeout_ms > 600000)
    return Status::InvalidArgument("store URI '" + uri.Redacted() + "': timeouts must be 1..600000 ms");
  if (*ttl > (uint64_t{1} << 40)) return Status::InvalidArgument("store URI '" + uri.Redacted() + "': ttl too large");
  o.connect_timeout_ms = static_cast<int>(connect_ms);
  o.timeout_ms = static_cast<int>(timeout_ms);
  o.pool = static_cast<size_t>(std::min<uint64_t>(pool, 1024));
  // userinfo: "user:password", ":password"; anything without ':' is a password.
  const size_t colon = uri.userinfo.find(':');
  if (colon == std::string::npos) {
    o.password = uri.userinfo;
  } else {
    o.user = uri.userinfo.substr(0, colon);
    o.password = uri.userinfo.substr(colon + 1);
  }
  if (!uri.path.empty() && uri.path != "/")
    return Status::InvalidArgument("store URI '" + uri.Redacted() + "': redis URIs take no path (database selection is not supported)");
  return o;
}

}  // namespace

Result<std::unique_ptr<ChunkStore>> OpenRedisStore(StoreUri uri) {
  uint64_t ttl = 0;
  CG_ASSIGN_OR_RETURN(RedisOptions options, TakeOptions(uri, &ttl));
  auto hosts = ParseHostList(uri.authority, 6379);
  if (!hosts.ok()) return Status::InvalidArgument("store URI '" + uri.Redacted() + "': " + hosts.status().message());
  if (hosts->size() != 1)
    return Status::InvalidArgument("store URI '" + uri.Redacted() + "': redis:// takes one host (for several, use redis-cluster://)");
  auto store = std::make_unique<RedisStore>(uri.Redacted(), ttl, hosts->front(), std::move(options));
  CG_RETURN_IF_ERROR(store->Ping());
  return std::unique_ptr<ChunkStore>(std::move(store));
}

Result<std::unique_ptr<ChunkStore>> OpenRedisClusterStore(StoreUri uri) {
  uint64_t ttl = 0;
  CG_ASSIGN_OR_RETURN(RedisOptions options, TakeOptions(uri, &ttl));
  auto hosts = ParseHostList(uri.authority, 6379);
  if (!hosts.ok()) return Status::InvalidArgument("store URI '" + uri.Redacted() + "': " + hosts.status().message());
  auto store = std::make_unique<RedisClusterStore>(uri.Redacted(), ttl, std::move(*hosts), std::move(options));
  CG_RETURN_IF_ERROR(store->Refresh(/*force=*/true));
  return std::unique_ptr<ChunkStore>(std::move(store));
}

}  // namespace cachegen::store
