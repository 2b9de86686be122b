// redis:// and redis-cluster:// stores against real redis-server processes
// (started here on free loopback ports; skipped when redis-server is not
// installed): the shared conformance suite, hash slots, TTL, AUTH, reconnect,
// corrupt values, ASK/MOVED during a slot migration, and a killed node.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "redis_fixture.h"
#include "store/record.h"
#include "store/redis.h"
#include "store_suite.h"

namespace cachegen::testing_store {

using testing_redis::RedisCli;
using testing_redis::RedisCluster;
using testing_redis::RedisServer;

namespace {

// One single server and one 3-master cluster per test process, started on
// first use and stopped at exit.
struct SharedServers {
  std::unique_ptr<RedisServer> single;
  std::unique_ptr<RedisCluster> cluster;
  std::string error;

  RedisServer* Single() {
    if (!single) {
      single = std::make_unique<RedisServer>();
      if (!single->Start(false)) error = single->error();
    }
    return single->running() ? single.get() : nullptr;
  }
  RedisCluster* Cluster() {
    if (!cluster) {
      cluster = std::make_unique<RedisCluster>();
      if (!cluster->Start(3)) error = cluster->error();
    }
    return cluster->error().empty() ? cluster.get() : nullptr;
  }
};
SharedServers& Servers() {
  static SharedServers s;
  return s;
}
class StopServers : public ::testing::Environment {
 public:
  void TearDown() override {
    Servers().cluster.reset();
    Servers().single.reset();
  }
};
const auto* const kStopServers = ::testing::AddGlobalTestEnvironment(new StopServers);

#define REQUIRE_REDIS()                                                             \
  do {                                                                              \
    if (!testing_redis::RedisServerAvailable()) GTEST_SKIP() << testing_redis::kNoRedisServer; \
  } while (0)

}  // namespace

std::unique_ptr<ChunkStore> OpenConformanceStore(const std::string& backend) {
  if (!testing_redis::RedisServerAvailable()) {
    [] { GTEST_SKIP() << testing_redis::kNoRedisServer; }();
    return nullptr;
  }
  std::string uri;
  if (backend == "redis") {
    RedisServer* s = Servers().Single();
    EXPECT_NE(s, nullptr) << Servers().error;
    if (!s) return nullptr;
    uri = "redis://" + s->Address();
  } else {
    RedisCluster* c = Servers().Cluster();
    EXPECT_NE(c, nullptr) << Servers().error;
    if (!c) return nullptr;
    uri = c->Uri();
  }
  auto store = OpenStore(uri);
  EXPECT_TRUE(store.ok()) << uri << ": " << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(Redis, StoreConformance, ::testing::Values("redis", "redis-cluster"));

namespace {

using store::KeyHashSlot;
using store::RedisKeyFor;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(RedisKeys, LayoutAndHashSlotsMatchTheServer) {
  const ChunkKey k = KeyOf(0x0123456789abcdefULL, 42);
  EXPECT_EQ(RedisKeyFor(k, 3), "cg:{efcdab89674523012a00000000000000}:3");
  EXPECT_EQ(KeyHashSlot("123456789"), 0x31c3 & 16383);  // CRC16-XMODEM check value
  EXPECT_EQ(KeyHashSlot("{user1000}.following"), KeyHashSlot("{user1000}.followers"));
  for (uint32_t level = 1; level < 8; ++level) EXPECT_EQ(KeyHashSlot(RedisKeyFor(k, level)), KeyHashSlot(RedisKeyFor(k, 0)));
  REQUIRE_REDIS();
  RedisCluster* c = Servers().Cluster();
  ASSERT_NE(c, nullptr) << Servers().error;
  std::mt19937_64 rng(5);
  std::vector<std::string> keys = {"123456789", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap",
                                   "foo{bar}{zap}", "{}", "a{b"};
  for (int i = 0; i < 20; ++i) keys.push_back(RedisKeyFor(RandomKey(rng), static_cast<uint32_t>(i % 4)));
  for (const std::string& key : keys)
    EXPECT_EQ(std::to_string(KeyHashSlot(key)), RedisCli(c->node(0).port(), "CLUSTER KEYSLOT '" + key + "'"))
        << key;
}

TEST(RedisStore, UnreachableServerIsAnIOErrorAtOpen) {
  const int port = testing_redis::FreePort();
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& uri : {"redis://127.0.0.1:" + std::to_string(port) + "?connect_timeout_ms=300",
                                 "redis-cluster://127.0.0.1:" + std::to_string(port) + "?connect_timeout_ms=300"}) {
    auto s = OpenStore(uri);
    ASSERT_FALSE(s.ok()) << uri;
    EXPECT_EQ(s.status().code(), StatusCode::kIOError) << s.status().ToString();
    EXPECT_NE(s.status().message().find(std::to_string(port)), std::string::npos) << s.status().message();
  }
  EXPECT_LT(SecondsSince(t0), 3.0);
}

TEST(RedisStore, RejectsMalformedUris) {
  for (const char* bad : {"redis://", "redis://h:1,h:2", "redis://h:99999", "redis://h:1?ttl=x", "redis://h:1?bogus=1",
                          "redis://h:1/3", "redis://h:1?timeout_ms=0", "redis-cluster://", "redis-cluster://h:1?x=1"}) {
    auto s = OpenStore(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status().ToString();
  }
}

TEST(RedisStore, TtlOption) {
  REQUIRE_REDIS();
  RedisServer* srv = Servers().Single();
  ASSERT_NE(srv, nullptr) << Servers().error;
  auto with = OpenStore("redis://" + srv->Address() + "?ttl=100");
  auto without = OpenStore("redis://" + srv->Address());
  ASSERT_TRUE(with.ok() && without.ok());
  const ChunkKey a = KeyOf(0x77, 1), b = KeyOf(0x77, 2);
  ASSERT_TRUE((*with)->Put(a, 0, TaggedFrame(1, 100)).ok());
  ASSERT_TRUE((*without)->Put(b, 0, TaggedFrame(2, 100)).ok());
  const int ttl = std::stoi(RedisCli(srv->port(), "TTL '" + RedisKeyFor(a, 0) + "'"));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 100);
  EXPECT_EQ(RedisCli(srv->port(), "TTL '" + RedisKeyFor(b, 0) + "'"), "-1");
}

TEST(RedisStore, AuthFromUserinfo) {
  REQUIRE_REDIS();
  RedisServer srv;
  ASSERT_TRUE(srv.Start(false, {"--requirepass", "s3cret"})) << srv.error();
  auto good = OpenStore("redis://:s3cret@" + srv.Address());
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ((*good)->uri(), "redis://***@" + srv.Address());
  ASSERT_TRUE((*good)->Put(KeyOf(1), 0, TaggedFrame(1, 50)).ok());
  EXPECT_TRUE((*good)->Get(KeyOf(1), 0).ok());
  for (const std::string& uri : {"redis://" + srv.Address(), "redis://:wrong@" + srv.Address()}) {
    auto bad = OpenStore(uri);
    ASSERT_FALSE(bad.ok()) << uri;
    EXPECT_EQ(bad.status().code(), StatusCode::kIOError) << bad.status().ToString();
    EXPECT_EQ(bad.status().message().find("wrong"), std::string::npos);  // no password in messages
  }
}

TEST(RedisStore, ReconnectsAfterTheServerDropsConnections) {
  REQUIRE_REDIS();
  RedisServer* srv = Servers().Single();
  ASSERT_NE(srv, nullptr) << Servers().error;
  auto s = OpenStore("redis://" + srv->Address());
  ASSERT_TRUE(s.ok());
  const ChunkKey k = KeyOf(0x99, 0x1);
  ASSERT_TRUE((*s)->Put(k, 0, TaggedFrame(3, 1000)).ok());
  const std::string killed = RedisCli(srv->port(), "CLIENT KILL TYPE normal");
  ASSERT_NE(killed, "0");  // at least our pooled connection was closed
  auto got = (*s)->Get(k, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(FrameTag(*got), 3);
}

TEST(RedisStore, CorruptOrMisplacedValueIsACountedMiss) {
  REQUIRE_REDIS();
  RedisServer* srv = Servers().Single();
  ASSERT_NE(srv, nullptr) << Servers().error;
  auto s = OpenStore("redis://" + srv->Address());
  ASSERT_TRUE(s.ok());
  std::mt19937_64 rng(11);
  const ChunkKey a = RandomKey(rng), b = RandomKey(rng);
  ASSERT_TRUE((*s)->Put(a, 0, TaggedFrame(1, 500)).ok());
  ASSERT_TRUE((*s)->Put(b, 0, TaggedFrame(2, 500)).ok());
  store::RedisNode raw("127.0.0.1", static_cast<uint16_t>(srv->port()), {});
  const std::string ka = RedisKeyFor(a, 0), kb = RedisKeyFor(b, 0);
  // Flip one payload bit of a's value.
  const std::string_view get_a[] = {"GET", ka};
  auto value = raw.Command(get_a);
  ASSERT_TRUE(value.ok());
  std::string bytes((*value)->str, (*value)->len);
  bytes[store::kRecordHeaderSize + 100] ^= 1;
  const std::string_view set_a[] = {"SET", ka, bytes};
  ASSERT_TRUE(raw.Command(set_a).ok());
  auto got = (*s)->Get(a, 0);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("checksum"), std::string::npos) << got.status().message();
  // b's value under a's key: a valid record, misplaced.
  const std::string_view copy[] = {"COPY", kb, ka, "REPLACE"};
  ASSERT_TRUE(raw.Command(copy).ok());
  got = (*s)->Get(a, 0);
  EXPECT_NE(got.status().message().find("misplaced"), std::string::npos) << got.status().message();
  // Truncated value.
  const std::string_view trunc[] = {"SET", ka, std::string_view(bytes).substr(0, 30)};
  ASSERT_TRUE(raw.Command(trunc).ok());
  EXPECT_EQ((*s)->Get(a, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*s)->stats().corrupt, 3u);
  EXPECT_EQ((*s)->stats().misses, 3u);
  EXPECT_TRUE((*s)->Get(b, 0).ok());
}

TEST(RedisStore, ClusterNodeBehindPlainUriAndPlainServerBehindClusterUri) {
  REQUIRE_REDIS();
  RedisCluster* c = Servers().Cluster();
  RedisServer* srv = Servers().Single();
  ASSERT_TRUE(c && srv) << Servers().error;
  auto plain = OpenStore("redis://" + c->node(0).Address());
  ASSERT_TRUE(plain.ok());
  std::mt19937_64 rng(3);
  int redirected = 0;
  for (int i = 0; i < 20; ++i) {
    const ChunkKey k = RandomKey(rng);
    if (c->OwnerOf(KeyHashSlot(RedisKeyFor(k, 0))) == 0) continue;
    const Status st = (*plain)->Put(k, 0, TaggedFrame(1, 10));
    EXPECT_EQ(st.code(), StatusCode::kIOError);
    EXPECT_NE(st.message().find("redis-cluster://"), std::string::npos) << st.message();
    ++redirected;
  }
  EXPECT_GT(redirected, 0);
  auto cluster_uri = OpenStore("redis-cluster://" + srv->Address());
  ASSERT_FALSE(cluster_uri.ok());
  EXPECT_EQ(cluster_uri.status().code(), StatusCode::kIOError);
  EXPECT_NE(cluster_uri.status().message().find("CLUSTER SLOTS"), std::string::npos) << cluster_uri.status().message();
}

TEST(RedisCluster, SeedListWithADeadNodeStillOpens) {
  REQUIRE_REDIS();
  RedisCluster* c = Servers().Cluster();
  ASSERT_NE(c, nullptr) << Servers().error;
  const std::string uri = "redis-cluster://127.0.0.1:" + std::to_string(testing_redis::FreePort()) + "," +
                          c->node(2).Address() + "?connect_timeout_ms=300";
  auto s = OpenStore(uri);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::mt19937_64 rng(8);
  std::set<int> owners;
  for (int i = 0; i < 30; ++i) {
    const ChunkKey k = RandomKey(rng);
    owners.insert(c->OwnerOf(KeyHashSlot(RedisKeyFor(k, 0))));
    ASSERT_TRUE((*s)->Put(k, 0, TaggedFrame(i, 200)).ok());
    auto got = (*s)->Get(k, 0);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(FrameTag(*got), i);
  }
  EXPECT_EQ(owners.size(), 3u);  // the keys really were spread over every master
}

// Migrates one slot from its owner A to B while a store is open: during the
// migration A answers ASK for keys it does not have, afterwards MOVED; the
// store follows both and returns the right frames.
TEST(RedisCluster, FollowsAskAndMovedDuringASlotMigration) {
  REQUIRE_REDIS();
  RedisCluster c;  // own cluster: the migration changes its slot map
  ASSERT_TRUE(c.Start(3)) << c.error();
  auto s = OpenStore(c.Uri());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::mt19937_64 rng(21);
  const ChunkKey k = RandomKey(rng);
  const int slot = KeyHashSlot(RedisKeyFor(k, 0));
  const int a = c.OwnerOf(slot), b = (a + 1) % 3;
  ASSERT_GE(a, 0);
  const int pa = c.node(a).port(), pb = c.node(b).port();
  const std::string id_a = RedisCli(pa, "CLUSTER MYID"), id_b = RedisCli(pb, "CLUSTER MYID");
  ASSERT_TRUE((*s)->Put(k, 0, TaggedFrame(10, 3000)).ok());

  ASSERT_EQ(RedisCli(pb, "CLUSTER SETSLOT " + std::to_string(slot) + " IMPORTING " + id_a), "OK");
  ASSERT_EQ(RedisCli(pa, "CLUSTER SETSLOT " + std::to_string(slot) + " MIGRATING " + id_b), "OK");
  // Level 1 of the same chunk: same slot, absent on A -> ASK to B.
  ASSERT_TRUE((*s)->Put(k, 1, TaggedFrame(11, 3000)).ok());
  EXPECT_NE(RedisCli(pa, "EXISTS '" + RedisKeyFor(k, 1) + "'").find("ASK"), std::string::npos);
  auto l1 = (*s)->Get(k, 1);
  ASSERT_TRUE(l1.ok()) << l1.status().ToString();
  EXPECT_EQ(FrameTag(*l1), 11);
  auto l0 = (*s)->Get(k, 0);  // still on A
  ASSERT_TRUE(l0.ok()) << l0.status().ToString();
  EXPECT_EQ(FrameTag(*l0), 10);

  EXPECT_EQ(RedisCli(pa, "MIGRATE 127.0.0.1 " + std::to_string(pb) + " '' 0 5000 KEYS '" + RedisKeyFor(k, 0) + "'"),
            "OK");
  for (int n : {b, a, (a + 2) % 3})
    ASSERT_EQ(RedisCli(c.node(n).port(), "CLUSTER SETSLOT " + std::to_string(slot) + " NODE " + id_b), "OK");
  EXPECT_NE(RedisCli(pa, "GET '" + RedisKeyFor(k, 0) + "'").find("MOVED"), std::string::npos);
  for (uint32_t level : {0u, 1u}) {
    auto got = (*s)->Get(k, level);  // the store's map still says A: MOVED
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(FrameTag(*got), 10 + static_cast<int>(level));
  }
  ASSERT_TRUE((*s)->Put(k, 2, TaggedFrame(12, 100)).ok());
  EXPECT_EQ(RedisCli(pb, "EXISTS '" + RedisKeyFor(k, 2) + "'"), "1");
  EXPECT_EQ((*s)->stats().corrupt, 0u);
}

// kill -9 one master: its keys fail fast with kIOError, the others are
// still served, nothing wrong is returned.
TEST(RedisCluster, KilledNodeFailsFastOthersStillServe) {
  REQUIRE_REDIS();
  RedisCluster c;
  ASSERT_TRUE(c.Start(3)) << c.error();
  auto s = OpenStore(c.Uri("?connect_timeout_ms=500&timeout_ms=500"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::mt19937_64 rng(4);
  std::vector<ChunkKey> keys;
  std::vector<int> owner;
  for (int i = 0; i < 60; ++i) {
    keys.push_back(RandomKey(rng));
    owner.push_back(c.OwnerOf(KeyHashSlot(RedisKeyFor(keys.back(), 0))));
    ASSERT_TRUE((*s)->Put(keys.back(), 0, TaggedFrame(i, 2000)).ok());
  }
  const int dead = 2;
  ASSERT_GT(std::count(owner.begin(), owner.end(), dead), 0);
  c.node(dead).Kill(SIGKILL);
  int served = 0, failed = 0;
  double worst = 0;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto got = (*s)->Get(keys[i], 0);
      worst = std::max(worst, SecondsSince(t0));
      if (owner[i] == dead) {
        ASSERT_FALSE(got.ok());
        EXPECT_EQ(got.status().code(), StatusCode::kIOError) << got.status().ToString();
        EXPECT_NE(got.status().message().find(c.node(dead).Address()), std::string::npos) << got.status().message();
        ++failed;
      } else {
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(FrameTag(*got), static_cast<int64_t>(i));
        ++served;
      }
    }
  }
  EXPECT_GT(served, 0);
  EXPECT_GT(failed, 0);
  EXPECT_LT(worst, 2.0) << "a Get took " << worst << " s";
  const auto t0 = std::chrono::steady_clock::now();
  const size_t on_dead = static_cast<size_t>(std::find(owner.begin(), owner.end(), dead) - owner.begin());
  EXPECT_EQ((*s)->Put(keys[on_dead], 1, TaggedFrame(1, 10)).code(), StatusCode::kIOError);
  EXPECT_LT(SecondsSince(t0), 2.0);
  EXPECT_EQ((*s)->stats().corrupt, 0u);
}

}  // namespace
}  // namespace cachegen::testing_store
