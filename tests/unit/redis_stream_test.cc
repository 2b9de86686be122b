// The chunk service and the streaming client end to end on a real 3-master
// Redis Cluster (started here on loopback ports; skipped without
// redis-server): put through the service, stream back bit-exact, and kill -9
// one master while a StreamClient fetches, directly and through the service.
// The killed node's chunks come back as errors to recompute, every other
// chunk is delivered and equals a direct decode, and Fetch returns.
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <functional>
#include <mutex>
#include <set>

#include "cachegen/service.h"
#include "cachegen/stream_client.h"
#include "redis_fixture.h"
#include "service_util.h"
#include "store/redis.h"

namespace cachegen {
namespace {

using testing_redis::RedisCluster;
using testing_service::ExpectDirectDecode;
using testing_service::ForwardingStore;
using testing_service::MakeContext;
using testing_service::TestContext;

constexpr const char* kToken = "cluster-token";

#define REQUIRE_REDIS()                                                                          \
  do {                                                                                           \
    if (!testing_redis::RedisServerAvailable()) GTEST_SKIP() << testing_redis::kNoRedisServer;  \
  } while (0)

// The cluster store as is, except that its `kill_at`-th Get first runs
// `kill`; it records which keys were read from then on (every such read
// reached the cluster after the kill).
class ReadLog final : public ForwardingStore {
 public:
  explicit ReadLog(std::unique_ptr<ChunkStore> inner) : ForwardingStore(inner.get()), owned_(std::move(inner)) {}
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++reads_ == kill_at && kill) {
        kill();
        killed_ = true;
      }
      if (killed_) after_kill_.insert(key);
    }
    return ForwardingStore::Get(key, level);
  }
  bool killed() {
    std::lock_guard<std::mutex> lock(mu_);
    return killed_;
  }
  bool ReadAfterKill(const ChunkKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return after_kill_.count(key) > 0;
  }
  // Set before the reads start.
  uint64_t kill_at = 0;
  std::function<void()> kill;

 private:
  std::unique_ptr<ChunkStore> owned_;
  std::mutex mu_;
  uint64_t reads_ = 0;
  bool killed_ = false;
  std::set<ChunkKey> after_kill_;
};

// A cluster, a store on it, a service over the store and a client of the service.
struct ClusterService {
  RedisCluster cluster;
  std::unique_ptr<ReadLog> store;
  std::unique_ptr<Service> service;
  std::unique_ptr<ChunkStore> client;

  ::testing::AssertionResult Start() {
    if (!cluster.Start(3)) return ::testing::AssertionFailure() << cluster.error();
    auto s = OpenStore(cluster.Uri("?connect_timeout_ms=500&timeout_ms=1000"));
    if (!s.ok()) return ::testing::AssertionFailure() << s.status().ToString();
    store = std::make_unique<ReadLog>(std::move(s).value());
    ServiceOptions opts;
    opts.token = kToken;
    opts.threads = 8;
    auto svc = Service::Start(store.get(), opts);
    if (!svc.ok()) return ::testing::AssertionFailure() << svc.status().ToString();
    service = std::move(svc).value();
    ClientOptions copts;
    copts.token = kToken;
    auto c = ConnectService("http://127.0.0.1:" + std::to_string(service->port()), copts);
    if (!c.ok()) return ::testing::AssertionFailure() << c.status().ToString();
    client = std::move(c).value();
    return ::testing::AssertionSuccess();
  }
  ~ClusterService() {
    client.reset();
    if (service) service->Stop();
  }
};

// 24 chunks of 16 tokens, 3 levels, stored through `via`.
TestContext StoreContext(ChunkStore& via) {
  TestContext c = MakeContext(24 * 16, 11);
  auto enc = Encoder::Create(c.config);
  EXPECT_TRUE(enc.ok());
  auto put = PutContext(via, c.root, c.tokens, c.kv.view(), *enc);
  EXPECT_TRUE(put.ok()) << put.status().ToString();
  if (put.ok()) {
    EXPECT_EQ(put->chunks_stored, 24u);
  }
  return c;
}

// Cluster node index that holds each chunk of `c` (all levels share a slot).
std::vector<int> Owners(RedisCluster& cluster, const TestContext& c) {
  std::vector<int> owner;
  for (const ChunkKey& k : ChunkKeys(c.root, c.tokens, c.chunk_tokens))
    owner.push_back(cluster.OwnerOf(store::KeyHashSlot(store::RedisKeyFor(k, 0))));
  return owner;
}

TEST(RedisClusterStream, PutAndStreamThroughTheServiceEndToEnd) {
  REQUIRE_REDIS();
  ClusterService cs;
  ASSERT_TRUE(cs.Start());
  const TestContext c = StoreContext(*cs.client);
  const std::vector<int> owner = Owners(cs.cluster, c);
  EXPECT_EQ(std::set<int>(owner.begin(), owner.end()).size(), 3u) << "chunks spread over all masters";
  for (int fixed : {-1, 0, 2}) {
    StreamOptions opts;
    opts.deadline_ms = 60000;
    opts.fixed_level = fixed;
    opts.inflight = 4;
    uint32_t delivered = 0;
    auto r = StreamClient(cs.client.get()).FetchTokens(c.root, c.tokens, c.chunk_tokens, opts,
                                                       [&](const StreamedChunk& s) {
                                                         EXPECT_EQ(s.index, delivered);
                                                         ++delivered;
                                                         ExpectDirectDecode(c, s);
                                                       });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->cached, 24u);
    EXPECT_EQ(delivered, 24u);
    EXPECT_TRUE(r->recompute.empty());
    EXPECT_EQ(r->errors.size(), 0u);
    if (fixed >= 0) {
      for (int l : r->levels) EXPECT_EQ(l, fixed);
    }
  }
  EXPECT_EQ(cs.store->stats().corrupt, 0u);
}

// Kills the master holding the last chunk when the stream's 6th chunk read
// reaches the cluster store, then checks the outcome. `via` is the store the
// client reads (the cluster store or the service over it).
void KillMidStream(ClusterService& cs, ChunkStore& via) {
  const TestContext c = StoreContext(*cs.store);
  const std::vector<ChunkKey> keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  const std::vector<int> owner = Owners(cs.cluster, c);
  const int dead = owner.back();
  cs.store->kill_at = 6;
  cs.store->kill = [&] { cs.cluster.node(static_cast<size_t>(dead)).Kill(SIGKILL); };

  StreamOptions opts;
  opts.deadline_ms = 60000;
  opts.inflight = 4;
  std::vector<uint32_t> delivered;
  auto r = StreamClient(&via).FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, [&](const StreamedChunk& s) {
    delivered.push_back(s.index);
    ExpectDirectDecode(c, s);
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(cs.store->killed()) << "the kill happened mid-stream";
  EXPECT_EQ(r->cached, 24u) << "the lookup ran before the kill";
  ASSERT_EQ(r->levels.size(), 24u);
  std::vector<uint32_t> expect_recompute;
  uint32_t failed_after_kill = 0;
  for (uint32_t i = 0; i < 24; ++i) {
    if (owner[i] != dead) {
      EXPECT_GE(r->levels[i], 0) << "chunk " << i << " on a live node";
    } else if (cs.store->ReadAfterKill(keys[i])) {
      EXPECT_EQ(r->levels[i], -1) << "chunk " << i << " read from the killed node";
      ++failed_after_kill;
    }
    if (r->levels[i] < 0) expect_recompute.push_back(i);
  }
  EXPECT_GT(failed_after_kill, 0u);
  EXPECT_TRUE(cs.store->ReadAfterKill(keys.back())) << "the last chunk was requested after the kill";
  EXPECT_EQ(r->recompute, expect_recompute);
  EXPECT_EQ(r->errors.size(), r->recompute.size() + r->fallbacks)
      << "one error line per failed chunk and per level tried instead, nothing planned away";
  for (const std::string& e : r->errors) EXPECT_NE(e.find("chunk "), std::string::npos) << e;
  EXPECT_EQ(delivered.size() + r->recompute.size(), 24u);
  EXPECT_EQ(cs.store->stats().corrupt, 0u);
  EXPECT_EQ(via.stats().corrupt, 0u);
}

TEST(RedisClusterStream, NodeKilledMidStreamDirect) {
  REQUIRE_REDIS();
  ClusterService cs;
  ASSERT_TRUE(cs.Start());
  KillMidStream(cs, *cs.store);
}

TEST(RedisClusterStream, NodeKilledMidStreamThroughTheService) {
  REQUIRE_REDIS();
  ClusterService cs;
  ASSERT_TRUE(cs.Start());
  KillMidStream(cs, *cs.client);
}

}  // namespace
}  // namespace cachegen
