// The HTTP chunk service on a loopback port over mem:// and file:// stores:
// auth, validation (nothing stored on 4xx), lookup, round trips through the
// streaming client, corruption, metrics, rate limiting, slow clients.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cachegen/service.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "service_util.h"

namespace cachegen {
namespace {

using namespace testing_service;
namespace fs = std::filesystem;

constexpr const char* kToken = "s3cret-token";
const ChunkKey kKey = *ChunkKey::FromHex("00112233445566778899aabbccddeeff");
const std::string kPath = "/v1/chunks/00112233445566778899aabbccddeeff/0";

class ServiceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { Restart({}); }
  void TearDown() override {
    Stop();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void Stop() {
    client_.reset();  // closes its keep-alive connections first
    if (service_) service_->Stop();
    service_.reset();
    store_.reset();
  }
  void Restart(ServiceOptions opts) {
    Stop();
    std::string uri = "mem://";
    if (GetParam() == "file") {
      if (dir_.empty()) dir_ = TempDir("cachegen-service-test");
      uri = "file://" + dir_.string();
    }
    auto store = OpenStore(uri);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    opts.token = kToken;
    if (opts.max_body_bytes == (64ull << 20)) opts.max_body_bytes = 1 << 20;
    opts.threads = 8;
    auto svc = Service::Start(store_.get(), opts);
    ASSERT_TRUE(svc.ok()) << svc.status().ToString();
    service_ = std::move(svc).value();
    ClientOptions copts;
    copts.token = kToken;
    client_ = std::move(ConnectService(Url(), copts)).value();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(service_->port()); }
  int port() const { return service_->port(); }

  // A valid frame of a small chunk, bound to kKey.
  std::vector<uint8_t> Frame(uint32_t level = 0) {
    TestContext c = MakeContext(16);
    c.config.levels = level + 1;
    auto frames = Encoder::Create(c.config)->EncodeChunk(c.kv.view(), 0, 16);
    EXPECT_TRUE(frames.ok());
    return *BindFrameToChunk((*frames)[level], kKey);
  }

  std::string Put(const std::string& path, const std::vector<uint8_t>& body, const std::string& auth) {
    std::string req = "PUT " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n";
    if (!auth.empty()) req += "Authorization: " + auth + "\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    req.append(body.begin(), body.end());
    return RawRequest(port(), req);
  }

  fs::path dir_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<ChunkStore> client_;
};


TEST_P(ServiceTest, WritesNeedTheBearerToken) {
  const auto frame = Frame();
  EXPECT_EQ(StatusOf(Put(kPath, frame, "")), 401);
  EXPECT_EQ(StatusOf(Put(kPath, frame, "Bearer wrong")), 401);
  EXPECT_EQ(StatusOf(Put(kPath, frame, "Basic s3cret-token")), 401);
  EXPECT_EQ(StatusOf(Put(kPath, frame, std::string("Bearer ") + kToken + "x")), 401);
  EXPECT_FALSE(store_->Size(kKey, 0).ok()) << "a refused write stored something";
  EXPECT_EQ(StatusOf(Put(kPath, frame, std::string("Bearer ") + kToken)), 201);
  ASSERT_TRUE(store_->Size(kKey, 0).ok());
  // Reads are open by default; deletes are not.
  EXPECT_EQ(StatusOf(RawRequest(port(), "GET " + kPath + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), 200);
  EXPECT_EQ(StatusOf(RawRequest(port(), "DELETE " + kPath + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")),
            401);
  EXPECT_TRUE(store_->Size(kKey, 0).ok());
  EXPECT_TRUE(client_->Delete(kKey, 0).ok());
  EXPECT_FALSE(store_->Size(kKey, 0).ok());

  // --auth-reads: reads need it too.
  ServiceOptions opts;
  opts.auth_reads = true;
  Restart(opts);
  ASSERT_TRUE(client_->Put(kKey, 0, frame).ok());
  EXPECT_EQ(StatusOf(RawRequest(port(), "GET " + kPath + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), 401);
  auto anon = ConnectService(Url());
  ASSERT_TRUE(anon.ok());
  const Status refused = (*anon)->Get(kKey, 0).status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("HTTP 401: missing bearer token"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(client_->Get(kKey, 0).ok());
}

TEST_P(ServiceTest, BadKeysLevelsAndBodiesAre4xxAndStoreNothing) {
  const auto frame = Frame();
  const std::string auth = std::string("Bearer ") + kToken;
  for (std::string bad : {"/v1/chunks/0011/0", "/v1/chunks/00112233445566778899aabbccddeeffaa/0",
                                 "/v1/chunks/g0112233445566778899aabbccddeeff/0",
                                 "/v1/chunks/00112233445566778899aabbccddeeff/8",
                                 "/v1/chunks/00112233445566778899aabbccddeeff/-1",
                                 "/v1/chunks/00112233445566778899aabbccddeeff/x",
                                 "/v1/chunks/00112233445566778899aabbccddeeff/",
                                 "/v1/chunks//0"}) {
    EXPECT_EQ(StatusOf(Put(bad, frame, auth)), 400) << bad;
  }
  // Not a frame; a frame of another level; a frame with trailing bytes; empty.
  std::vector<uint8_t> junk(frame.size(), 0x5a);
  EXPECT_EQ(StatusOf(Put(kPath, junk, auth)), 400);
  EXPECT_EQ(StatusOf(Put("/v1/chunks/00112233445566778899aabbccddeeff/1", frame, auth)), 400);
  auto longer = frame;
  longer.push_back(0);
  EXPECT_EQ(StatusOf(Put(kPath, longer, auth)), 400);
  EXPECT_EQ(StatusOf(Put(kPath, {}, auth)), 400);
  auto truncated = frame;
  truncated.resize(frame.size() / 2);
  EXPECT_EQ(StatusOf(Put(kPath, truncated, auth)), 400);
  auto damaged = frame;  // a section payload byte: the header is intact, the section's checksum is not
  damaged.back() ^= 0x40;
  EXPECT_EQ(StatusOf(Put(kPath, damaged, auth)), 400);
  // A frame that cannot prove it is this chunk: bound to another key, or to none.
  const ChunkKey other = *ChunkKey::FromHex("ffeeddccbbaa99887766554433221100");
  const std::string misplaced = Put(kPath, *BindFrameToChunk(frame, other), auth);
  EXPECT_EQ(StatusOf(misplaced), 400);
  EXPECT_NE(misplaced.find("bound to chunk ffeeddcc"), std::string::npos) << misplaced;
  TestContext c = MakeContext(16);
  const auto unbound = Encoder::Create(c.config)->EncodeChunk(c.kv.view(), 0, 16);
  ASSERT_TRUE(unbound.ok());
  EXPECT_EQ(StatusOf(Put(kPath, (*unbound)[0], auth)), 400);
  for (uint32_t l = 0; l < kMaxChunkLevels; ++l) EXPECT_FALSE(store_->Size(kKey, l).ok()) << l;
  // Unknown endpoints; a method the path does not take.
  EXPECT_EQ(StatusOf(RawRequest(port(), "GET /v2/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), 404);
  const std::string post = RawRequest(port(), "POST " + kPath + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                                              "Connection: close\r\n\r\n");
  EXPECT_EQ(StatusOf(post), 405);
  EXPECT_NE(post.find("Allow: GET, HEAD, PUT, DELETE"), std::string::npos) << post;
  // A garbage request line.
  const int garbage = StatusOf(RawRequest(port(), "HELLO\r\n\r\n", true));
  EXPECT_TRUE(garbage == 400 || garbage == 0) << garbage;
}

TEST_P(ServiceTest, OversizedBodiesAre413) {
  ServiceOptions opts;
  opts.read_timeout_ms = 300;
  Restart(opts);
  const std::string auth = std::string("Bearer ") + kToken;
  std::vector<uint8_t> big((1 << 20) + 1, 1);
  EXPECT_EQ(StatusOf(Put(kPath, big, auth)), 413);
  EXPECT_FALSE(store_->Size(kKey, 0).ok());
  // Also when the client lies about the length and never sends it.
  const std::string req = "PUT " + kPath + " HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth +
                          "\r\nContent-Length: 100000000\r\n\r\nabc";
  const std::string resp = RawRequest(port(), req, false, 5000);
  EXPECT_TRUE(resp.empty() || StatusOf(resp) == 413) << resp.substr(0, 40);
  EXPECT_FALSE(store_->Size(kKey, 0).ok());
}

TEST_P(ServiceTest, TruncatedAndStalledRequestsStoreNothing) {
  ServiceOptions opts;
  opts.read_timeout_ms = 300;
  Restart(opts);
  const auto frame = Frame();
  const std::string head = "PUT " + kPath + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + kToken +
                           "\r\nContent-Length: " + std::to_string(frame.size()) + "\r\n\r\n";
  // Half the body, then the client closes its side.
  std::string req = head;
  req.append(frame.begin(), frame.begin() + static_cast<long>(frame.size() / 2));
  const std::string resp = RawRequest(port(), req, true);
  EXPECT_TRUE(resp.empty() || StatusOf(resp) >= 400) << resp.substr(0, 40);
  // Half the body, then the client stalls: the server times out and drops it.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string stalled = RawRequest(port(), req, false, 5000);  // no Connection: close
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 4.0) << "a stalled client was not dropped";
  EXPECT_EQ(StatusOf(stalled), 400);
  // Headers that never end.
  const std::string partial = RawRequest(port(), "GET " + kPath + " HTTP/1.1\r\nHost: x\r\n", false, 5000);
  EXPECT_TRUE(partial.empty() || StatusOf(partial) >= 400);
  EXPECT_FALSE(store_->Size(kKey, 0).ok());
}

TEST_P(ServiceTest, HeadGetDeleteAndLookup) {
  TestContext c = MakeContext(56);
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(enc.ok());
  auto put = PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->chunks, 4u);
  EXPECT_EQ(put->frames, 12u);
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  for (const auto& k : keys)
    for (uint32_t l = 0; l < 3; ++l) {
      auto a = client_->Size(k, l), b = store_->Size(k, l);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*a, *b);
    }
  EXPECT_EQ(client_->Size(keys[0], 3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->Get(keys[0], 5).status().code(), StatusCode::kNotFound);

  // Lookup by keys (the client's batch path) and by tokens (raw JSON).
  auto found = LookupPrefix(*client_, keys, 4);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[1].level_bytes.size(), 4u);
  EXPECT_EQ(found[1].level_bytes[3], 0u);
  EXPECT_EQ(found[1].level_bytes[2], *store_->Size(keys[1], 2));
  nlohmann::json q{{"root", c.root.Hex()}, {"chunk_tokens", c.chunk_tokens}, {"tokens", c.tokens}, {"levels", 3}};
  auto extended = c.tokens;
  extended.insert(extended.end(), 40, 5);  // two more chunks, not cached
  q["tokens"] = extended;
  const std::string body = q.dump();
  const std::string resp = RawRequest(port(), "POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                              "Content-Length: " + std::to_string(body.size()) +
                                              "\r\nConnection: close\r\n\r\n" + body);
  ASSERT_EQ(StatusOf(resp), 200) << resp;
  auto j = nlohmann::json::parse(resp.substr(resp.find("\r\n\r\n") + 4));
  EXPECT_EQ(j["cached"], 3);  // chunk 3 is partial in the stored context: its key differs now
  EXPECT_EQ(j["requested"], 6);
  EXPECT_EQ(j["chunks"][0]["key"], keys[0].Hex());
  EXPECT_EQ(j["chunks"][0]["sizes"].size(), 3u);
  for (const std::string& bad : {std::string("{"), std::string("[]"), std::string("{\"keys\":[\"zz\"]}"),
                                 std::string("{\"keys\":\"x\"}"), std::string("{\"tokens\":[1,2]}"),
                                 std::string("{\"root\":\"") + c.root.Hex() + "\",\"tokens\":[1,\"a\"]}",
                                 std::string("{\"keys\":[],\"levels\":9}"), std::string("{}")}) {
    const std::string r = RawRequest(port(), "POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                                                 std::to_string(bad.size()) + "\r\nConnection: close\r\n\r\n" + bad);
    EXPECT_EQ(StatusOf(r), 400) << bad;
  }

  // Delete one level: lookups still find the chunk at the others.
  ASSERT_TRUE(client_->Delete(keys[2], 0).ok());
  EXPECT_TRUE(client_->Delete(keys[2], 0).ok()) << "deleting an absent entry is not an error";
  found = LookupPrefix(*client_, keys, 3);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[2].level_bytes[0], 0u);
}

// Every delivered chunk equals a direct decode of the frame encoded locally.
void ExpectRoundTrip(ChunkStore& remote, const TestContext& c, int fixed_level) {
  StreamOptions opts;
  opts.deadline_ms = 60000;
  opts.fixed_level = fixed_level;
  opts.inflight = 3;
  StreamClient client(&remote);
  uint32_t delivered = 0;
  auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, [&](const StreamedChunk& s) {
    EXPECT_EQ(s.index, delivered) << "chunks are delivered in order";
    ++delivered;
    ExpectDirectDecode(c, s);
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cached, 4u);
  EXPECT_EQ(delivered, 4u);
  EXPECT_TRUE(r->recompute.empty());
  EXPECT_TRUE(r->errors.empty());
  EXPECT_TRUE(r->deadline_met);
  if (fixed_level >= 0) {
    for (int l : r->levels) EXPECT_EQ(l, fixed_level);
  }
}

TEST_P(ServiceTest, PutThenStreamEqualsDirectDecode) {
  TestContext c = MakeContext(56);
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc).ok());
  ExpectRoundTrip(*client_, c, -1);  // adaptive (loose deadline: finest after the probe)
  ExpectRoundTrip(*client_, c, 2);
  ExpectRoundTrip(*store_, c, 1);  // the same client directly on the store
}

// A store whose reads of one key wait until `release` is set: the chunks
// after it arrive first.
class HoldOneKeyStore : public ForwardingStore {
 public:
  HoldOneKeyStore(ChunkStore* inner, ChunkKey held) : ForwardingStore(inner), held_(held) {}
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    if (key == held_)
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else
      ++others_read;
    return ForwardingStore::Get(key, level);
  }
  std::atomic<bool> release{false};
  std::atomic<int> others_read{0};

 private:
  ChunkKey held_;
};

// Chunks that arrive before an earlier one are decoded while it is awaited
// and still handed over in chunk order, each equal to a direct decode; a
// second fetch by the same client (reusing its decoded tensors) too.
TEST_P(ServiceTest, ChunksArrivedEarlyAreDecodedAheadAndHandedOverInOrder) {
  TestContext c = MakeContext(64);
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(PutContext(*store_, c.root, c.tokens, c.kv.view(), *enc).ok());
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  ASSERT_EQ(keys.size(), 4u);
  HoldOneKeyStore held(store_.get(), keys[0]);
  StreamClient client(&held);
  StreamOptions opts;
  opts.deadline_ms = 60000;
  opts.fixed_level = 1;
  opts.inflight = 4;
  for (int fetch = 0; fetch < 2; ++fetch) {
    held.release = false;
    held.others_read = 0;
    std::thread releaser([&] {
      // Chunk 0 comes once the three others have been read (and a little
      // more, for their decodes to start).
      while (held.others_read.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      held.release = true;
    });
    uint32_t delivered = 0;
    auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, [&](const StreamedChunk& s) {
      EXPECT_EQ(s.index, delivered) << "chunks are delivered in order";
      ++delivered;
      ExpectDirectDecode(c, s);
    });
    releaser.join();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(delivered, 4u) << "fetch " << fetch;
    EXPECT_TRUE(r->errors.empty());
    EXPECT_EQ(r->levels, (std::vector<int>{1, 1, 1, 1}));
  }
}

// A store whose n-th read (from 1) takes at least delay_us(n), and which
// counts the most reads in flight at once and the reads that ended before
// two were first in flight at once.
class SlowReadsStore : public ForwardingStore {
 public:
  SlowReadsStore(ChunkStore* inner, std::function<int(int)> delay_us)
      : ForwardingStore(inner), delay_us_(std::move(delay_us)) {}
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    int started = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      started = ++reads_started_;
      most_in_flight_ = std::max(most_in_flight_, ++in_flight_);
      if (in_flight_ >= 2 && solo_reads_ < 0) solo_reads_ = reads_done_;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_(started)));
    auto frame = ForwardingStore::Get(key, level);
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    ++reads_done_;
    return frame;
  }
  int solo_reads() {
    std::lock_guard<std::mutex> lock(mu_);
    return solo_reads_;
  }
  int most_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_in_flight_;
  }

 private:
  std::function<int(int)> delay_us_;
  std::mutex mu_;
  int in_flight_ = 0, most_in_flight_ = 0, reads_started_ = 0, reads_done_ = 0, solo_reads_ = -1;
};

// Five chunks of 256 tokens (about 260 KB each at level 0), two levels, in
// a mem:// store, fetched through a store that wraps it (SlowReadsStore):
// every chunk handed over must equal a direct decode.
class StreamStart : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.chunk_tokens = 256;
    c_.kv = std::move(SyntheticKV({4, 4, 128, 5 * c_.chunk_tokens}, DType::kF16, 7)).value();
    for (uint32_t i = 0; i < c_.kv.shape().tokens; ++i) c_.tokens.push_back(static_cast<TokenId>(i * 7919 % 32000));
    c_.root = ChainRoot("test-model", "test-profile", c_.chunk_tokens);
    c_.config.chunk_tokens = c_.chunk_tokens;
    c_.config.levels = 2;
    auto enc = Encoder::Create(c_.config);
    ASSERT_TRUE(enc.ok());
    auto mem = OpenStore("mem://");
    ASSERT_TRUE(mem.ok());
    mem_ = std::move(*mem);
    ASSERT_TRUE(PutContext(*mem_, c_.root, c_.tokens, c_.kv.view(), *enc).ok());
  }
  // A loose deadline; fixed_level < 0: adaptive.
  static StreamOptions Options(int fixed_level) {
    StreamOptions o;
    o.deadline_ms = 60000;
    o.fixed_level = fixed_level;
    return o;
  }
  // Fetches the five chunks from `store`; after_each runs after each chunk
  // handed over is checked.
  Result<StreamResult> Fetch(ChunkStore* store, const StreamOptions& o, const std::function<void()>& after_each = {}) {
    StreamClient client(store);
    return client.FetchTokens(c_.root, c_.tokens, c_.chunk_tokens, o, [&](const StreamedChunk& s) {
      ExpectDirectDecode(c_, s);
      if (after_each) after_each();
    });
  }
  TestContext c_;
  std::unique_ptr<ChunkStore> mem_;
};

TEST_F(StreamStart, TheFirstEstimateCountsTheProbeFromItsRequest) {
  // The first two reads take 2.6 ms, later ones 50 ms, so that two requests
  // issued together are seen together: a fetch thread that starts its read
  // a few ms late (ASan on a loaded 2-core machine) must not make the read
  // before it look alone.
  SlowReadsStore slow(mem_.get(), [](int n) { return n <= 2 ? 2600 : 50000; });
  StreamOptions opts = Options(-1);
  opts.inflight = 4;
  auto r = Fetch(&slow, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->recompute.empty());
  ASSERT_GE(slow.solo_reads(), 0) << "no two reads were ever in flight at once";
  EXPECT_LE(slow.solo_reads(), 2);
}

// A fixed-level client keeps two requests in flight while more would queue
// over 10 ms of transfer (each 260 KB frame takes 30 ms here): requests
// beyond that would share the link and delay the first chunk. Two from the
// start, before the first read has measured the link.
TEST_F(StreamStart, AFixedLevelClientQueuesNoMoreThanTheLinkNeeds) {
  SlowReadsStore slow(mem_.get(), [](int) { return 30000; });
  StreamOptions opts = Options(0);
  opts.inflight = 4;
  auto r = Fetch(&slow, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->levels, (std::vector<int>{0, 0, 0, 0, 0}));
  EXPECT_EQ(slow.most_in_flight(), 2);
}

// Reads that wait a round trip before their first bytes and then take
// `transfer` for the frame, reported in two halves (a link far away).
class FarStore : public ForwardingStore {
 public:
  FarStore(ChunkStore* inner, std::chrono::milliseconds round_trip, std::chrono::milliseconds transfer)
      : ForwardingStore(inner), round_trip_(round_trip), transfer_(transfer) {}
  Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level, const Progress& progress) override {
    std::this_thread::sleep_for(round_trip_);
    Result<std::vector<uint8_t>> frame = Get(key, level);
    if (!frame.ok() || !progress) return frame;
    if (!progress(frame->size() / 2)) return Status::IOError("abandoned");
    std::this_thread::sleep_for(transfer_);
    progress(frame->size());
    return frame;
  }

 private:
  std::chrono::milliseconds round_trip_, transfer_;
};

// One request at a time over a link 60 ms away whose frames take 20 ms:
// counted from each request, the link would read 4 times slower than it
// is. The client learns the round trip from the first request's first
// bytes and leaves it out of the later ones' link time (LinkClock).
TEST_F(StreamStart, TheRateLeavesTheRoundTripOut) {
  FarStore far(mem_.get(), std::chrono::milliseconds(60), std::chrono::milliseconds(20));
  StreamOptions opts = Options(0);
  opts.inflight = 1;
  auto r = Fetch(&far, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->levels, (std::vector<int>{0, 0, 0, 0, 0}));
  // About 260 KB a frame: 3.3 MB/s with the round trips, 13 MB/s without.
  const double with_round_trips = static_cast<double>(r->bytes) / 5 / 0.080;
  EXPECT_GT(r->bandwidth_bytes_s, 2 * with_round_trips);
}

// A cancelled fetch ends without handing over more chunks; the rest come
// back for recompute, with one error line.
TEST_F(StreamStart, ACancelledFetchEndsAndReturnsTheRest) {
  SlowReadsStore slow(mem_.get(), [](int) { return 20000; });
  std::atomic<bool> cancel{false};
  StreamOptions opts = Options(0);
  opts.cancel = &cancel;
  uint32_t delivered = 0;
  auto r = Fetch(&slow, opts, [&] {
    ++delivered;
    cancel = true;
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(delivered, 1u);
  EXPECT_EQ(r->levels, (std::vector<int>{0, -1, -1, -1, -1}));
  EXPECT_EQ(r->recompute, (std::vector<uint32_t>{1, 2, 3, 4}));
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0].rfind("cancelled", 0), 0u) << r->errors[0];
}

// A store that cannot answer for one chunk (a disk or a Redis node that
// fails), and has every other chunk it holds.
class FailingSizeStore : public ForwardingStore {
 public:
  FailingSizeStore(ChunkStore* inner, ChunkKey failing) : ForwardingStore(inner), failing_(failing) {}
  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    if (key == failing_) return Status::IOError("node down");
    return ForwardingStore::Size(key, level);
  }

 private:
  ChunkKey failing_;
};

// A lookup ends at a store that cannot answer and says why, directly and
// through the service; a chunk that is missing ends it without an error.
// The streaming client reports the failure and delivers the prefix before it.
TEST(Lookup, AStoreThatCannotAnswerEndsThePrefixAndSaysWhy) {
  TestContext c = MakeContext(64);  // 4 chunks of 16 tokens
  auto mem = OpenStore("mem://");
  ASSERT_TRUE(mem.ok());
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(enc.ok());
  ASSERT_TRUE(PutContext(**mem, c.root, c.tokens, c.kv.view(), *enc).ok());
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  ASSERT_EQ(keys.size(), 4u);
  FailingSizeStore failing(mem->get(), keys[2]);

  Status error = Status::Internal("not set");
  EXPECT_EQ(LookupPrefix(**mem, keys, 3, &error).size(), 4u);
  EXPECT_TRUE(error.ok()) << error.ToString();
  EXPECT_EQ(LookupPrefix(failing, keys, 3, &error).size(), 2u);
  EXPECT_EQ(error.code(), StatusCode::kIOError);
  EXPECT_NE(error.message().find("node down"), std::string::npos);

  auto service = Service::Start(&failing, ServiceOptions{});
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  const std::string url = "http://127.0.0.1:" + std::to_string((*service)->port());
  auto remote = ConnectService(url);
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ(LookupPrefix(**remote, keys, 3, &error).size(), 2u);
  EXPECT_EQ(error.code(), StatusCode::kIOError);
  EXPECT_NE(error.message().find("node down"), std::string::npos) << error.ToString();

  StreamOptions opts;
  opts.deadline_ms = 60000;
  StreamClient client(remote->get());
  auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, [&](const StreamedChunk& s) {
    ExpectDirectDecode(c, s);
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cached, 2u);
  EXPECT_EQ(r->levels.size(), 2u);
  EXPECT_EQ(r->lookup_status.code(), StatusCode::kIOError);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0].rfind("lookup: ", 0), 0u) << r->errors[0];
  EXPECT_NE((*service)->MetricsText().find("cachegen_lookup_store_errors_total 2\n"), std::string::npos)
      << (*service)->MetricsText();

  // A missing chunk: the prefix ends, and nothing failed.
  ASSERT_TRUE((*mem)->Delete(keys[1], 0).ok() && (*mem)->Delete(keys[1], 1).ok() && (*mem)->Delete(keys[1], 2).ok());
  EXPECT_EQ(LookupPrefix(**remote, keys, 3, &error).size(), 1u);
  EXPECT_TRUE(error.ok()) << error.ToString();

  // No service at all: an error, not an empty cache.
  remote->reset();
  (*service)->Stop();
  auto gone = ConnectService(url);
  ASSERT_TRUE(gone.ok());
  StreamClient orphan(gone->get());
  auto none = orphan.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, nullptr);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->cached, 0u);
  EXPECT_EQ(none->lookup_status.code(), StatusCode::kIOError);
}

TEST_P(ServiceTest, CorruptChunkIsAMissAndRecomputed) {
  if (GetParam() != "file") GTEST_SKIP() << "corrupts bytes on disk (file:// only)";
  TestContext c = MakeContext(56);
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc).ok());
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  // Flip one byte in the middle of every level file of chunk 1.
  int corrupted = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    if (!e.is_regular_file() || e.path().filename().string().rfind(keys[1].Hex(), 0) != 0) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(e.path());
    f.seekg(static_cast<std::streamoff>(size / 2));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x40);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(&b, 1);
    ++corrupted;
  }
  ASSERT_EQ(corrupted, 3);
  EXPECT_EQ(client_->Get(keys[1], 0).status().code(), StatusCode::kNotFound);
  EXPECT_GE(store_->stats().corrupt, 1u);
  EXPECT_NE(service_->MetricsText().find("cachegen_chunk_misses_total 1\n"), std::string::npos)
      << service_->MetricsText();
  // Lookup still lists chunk 1 (Size does not read); streaming reports the
  // failure for that chunk only and hands it back for recompute.
  StreamOptions opts;
  opts.deadline_ms = 60000;
  opts.fixed_level = 0;
  StreamClient client(client_.get());
  std::vector<uint32_t> delivered;
  auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts,
                              [&](const StreamedChunk& s) { delivered.push_back(s.index); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(delivered, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(r->recompute, (std::vector<uint32_t>{1}));
  // The lookup saw levels 1 and 2 (level 0's size is unreadable); the
  // level asked for failed, then the other stored one was tried.
  EXPECT_EQ(r->fallbacks, 1u);
  ASSERT_EQ(r->errors.size(), 2u) << ::testing::PrintToString(r->errors);
  for (const std::string& e : r->errors) EXPECT_NE(e.find("chunk 1"), std::string::npos) << e;
}

// What a fetch of c at level 0 delivered: chunk index -> level.
std::map<uint32_t, uint32_t> FetchLevels(ChunkStore* store, const TestContext& c, StreamResult* out,
                                         StreamOptions opts = {}) {
  opts.deadline_ms = 60000;
  opts.fixed_level = 0;
  StreamClient client(store);
  std::map<uint32_t, uint32_t> delivered;
  auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, [&](const StreamedChunk& s) {
    delivered[s.index] = s.level;
    ExpectDirectDecode(c, s);
  });
  EXPECT_TRUE(r.ok());
  if (r.ok()) *out = *r;
  return delivered;
}

// Frames in the store under the wrong key (written behind the service's
// back, as a buggy or older writer would): a fetch never takes them as the
// chunk asked for. Each is a miss, counted, and the chunk comes from another
// level or is recomputed.
TEST_P(ServiceTest, FramesUnderTheWrongKeyAreMisses) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  TestContext c = MakeContext(64);
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc).ok());
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  // Chunk 1's frames, bound to chunk 1, stored as chunk 0 at every level.
  for (uint32_t l = 0; l < 3; ++l) ASSERT_TRUE(store_->Put(keys[0], l, *store_->Get(keys[1], l)).ok());
  StreamResult r;
  EXPECT_EQ(FetchLevels(client_.get(), c, &r), (std::map<uint32_t, uint32_t>{{1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(r.recompute, (std::vector<uint32_t>{0}));
  EXPECT_EQ(r.rejected, 3u);
  ASSERT_FALSE(r.errors.empty());
  EXPECT_NE(r.errors[0].find("misplaced frame: it is chunk " + keys[1].Hex()), std::string::npos) << r.errors[0];

  // Chunk 1's frame bound to chunk 0 (a writer that bound the wrong chunk):
  // its token range gives it away. Level 1 stays chunk 0's own.
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc).ok());
  ASSERT_TRUE(store_->Delete(keys[0], 0).ok());
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *enc).ok());
  ASSERT_TRUE(store_->Put(keys[0], 0, *BindFrameToChunk(*store_->Get(keys[1], 0), keys[0])).ok());
  EXPECT_EQ(FetchLevels(client_.get(), c, &r), (std::map<uint32_t, uint32_t>{{0, 1}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_TRUE(r.recompute.empty());
  EXPECT_EQ(r.fallbacks, 1u);
  EXPECT_NE(r.errors[0].find("frame holds tokens [16, 32), the chunk is [0, 16)"), std::string::npos) << r.errors[0];

  // A shorter frame (8 tokens) bound to chunk 2, and a frame of another
  // shape bound to chunk 3, at every level: misses, not a short or
  // misaligned delivery, and not an aborted fetch.
  TestContext shorter = MakeContext(8);
  auto short_frames = Encoder::Create(shorter.config)->EncodeChunk(c.kv.view().Tokens(32, 8), 32, 64);
  TestContext wide = MakeContext(64);
  wide.kv = std::move(SyntheticKV({3, 2, 32, 64}, DType::kF16, 9)).value();
  auto wide_frames = Encoder::Create(wide.config)->EncodeChunk(wide.kv.view().Tokens(48, 16), 48, 64);
  ASSERT_TRUE(short_frames.ok() && wide_frames.ok());
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_TRUE(store_->Put(keys[2], l, *BindFrameToChunk((*short_frames)[l], keys[2])).ok());
    ASSERT_TRUE(store_->Put(keys[3], l, *BindFrameToChunk((*wide_frames)[l], keys[3])).ok());
  }
  EXPECT_EQ(FetchLevels(client_.get(), c, &r), (std::map<uint32_t, uint32_t>{{0, 1}, {1, 0}}));
  EXPECT_EQ(r.recompute, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(r.rejected, 7u);  // chunk 0's level 0, and every level of chunks 2 and 3
  // A context whose first chunk has another shape: with the shape known up
  // front (an engine knows its model's), that chunk is refused too, not
  // taken as the shape every other chunk must have.
  for (uint32_t l = 0; l < 3; ++l)
    ASSERT_TRUE(store_->Put(keys[0], l, *BindFrameToChunk((*wide_frames)[l], keys[0])).ok());
  StreamOptions known;
  known.shape = KVShape{2, 2, 32, 0};
  EXPECT_EQ(FetchLevels(client_.get(), c, &r, known), (std::map<uint32_t, uint32_t>{{1, 0}}));
  EXPECT_EQ(r.recompute, (std::vector<uint32_t>{0, 2, 3}));
}

// Frames of the old format (version 1, bound to no key) are read by the
// decoder and by inspect, but a fetch cannot tell which chunk they are.
TEST_P(ServiceTest, UnboundFramesAreMissesButStillDecode) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  TestContext c = MakeContext(16);
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  auto frames = Encoder::Create(c.config)->EncodeChunk(c.kv.view(), 0, 16);
  ASSERT_TRUE(frames.ok());
  Result<FrameInfo> info = InspectFrame((*frames)[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->format_version, 1u);
  EXPECT_FALSE(info->chunk_key);
  KVTensor out(info->shape, DType::kF16);
  EXPECT_TRUE(DecodeFrame((*frames)[0], out.view()).ok());
  for (uint32_t l = 0; l < 3; ++l) ASSERT_TRUE(store_->Put(keys[0], l, (*frames)[l]).ok());
  StreamResult r;
  EXPECT_TRUE(FetchLevels(client_.get(), c, &r).empty());
  EXPECT_EQ(r.rejected, 3u);
  EXPECT_NE(r.errors[0].find("not bound to a chunk key"), std::string::npos) << r.errors[0];
}

// One damaged level does not cost the chunk its other levels.
TEST_P(ServiceTest, ADamagedLevelFallsBackToAnotherStoredLevel) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  TestContext c = MakeContext(48);
  ASSERT_TRUE(PutContext(*client_, c.root, c.tokens, c.kv.view(), *Encoder::Create(c.config)).ok());
  const auto keys = ChunkKeys(c.root, c.tokens, c.chunk_tokens);
  std::vector<uint8_t> damaged = *store_->Get(keys[1], 0);
  damaged[damaged.size() - 3] ^= 0x10;  // a section payload byte: the store's record is intact
  ASSERT_TRUE(store_->Put(keys[1], 0, damaged).ok());
  StreamResult r;
  EXPECT_EQ(FetchLevels(client_.get(), c, &r), (std::map<uint32_t, uint32_t>{{0, 0}, {1, 1}, {2, 0}}));
  EXPECT_TRUE(r.recompute.empty());
  EXPECT_EQ(r.fallbacks, 1u);
  EXPECT_EQ(r.rejected, 0u);  // the service client refused it already (VerifyFrame): a miss
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("failed verification; trying level 1"), std::string::npos) << r.errors[0];
  // Straight from the store (no service client to verify it), the fetch
  // itself refuses the damaged frame.
  EXPECT_EQ(FetchLevels(store_.get(), c, &r), (std::map<uint32_t, uint32_t>{{0, 0}, {1, 1}, {2, 0}}));
  EXPECT_EQ(r.rejected, 1u);
  EXPECT_NE(r.errors[0].find("section checksum mismatch; trying level 1"), std::string::npos) << r.errors[0];
}

// A store that stops answering (a Redis under SIGSTOP): its calls block
// until Release.
class StalledStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::atomic<bool> stall_sizes{false}, stall_gets{false};
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    if (stall_gets) Wait();
    return ForwardingStore::Get(key, level);
  }
  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    if (stall_sizes) Wait();
    return ForwardingStore::Size(key, level);
  }

 private:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return released_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// The deadline bounds the whole fetch whatever the store does: a lookup or
// reads that never answer end the fetch at the deadline, timed out, every
// chunk left to recompute; the store's calls end later, on their own.
TEST(StreamDeadline, AStalledStoreCannotHoldAFetchPastItsDeadline) {
  TestContext c = MakeContext(64);
  auto mem = OpenStore("mem://");
  ASSERT_TRUE(mem.ok());
  ASSERT_TRUE(PutContext(**mem, c.root, c.tokens, c.kv.view(), *Encoder::Create(c.config)).ok());
  for (const bool lookup : {true, false}) {
    StalledStore store(mem->get());
    (lookup ? store.stall_sizes : store.stall_gets) = true;
    {
      StreamClient client(&store);
      StreamOptions opts;
      opts.deadline_ms = 300;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = client.FetchTokens(c.root, c.tokens, c.chunk_tokens, opts, nullptr);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(r.ok());
      EXPECT_LT(ms, 1000) << (lookup ? "lookup" : "reads");
      EXPECT_TRUE(r->timed_out);
      EXPECT_FALSE(r->deadline_met);
      EXPECT_EQ(r->cached, lookup ? 0u : 4u);
      EXPECT_EQ(r->recompute.size(), lookup ? 0u : 4u);
      ASSERT_FALSE(r->errors.empty());
      EXPECT_NE(r->errors.back().find("timed out"), std::string::npos) << r->errors.back();
      store.Release();  // before the client joins its stragglers
    }
  }
}

TEST_P(ServiceTest, MetricsAndHealth) {
  EXPECT_EQ(StatusOf(RawRequest(port(), "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), 200);
  ASSERT_TRUE(client_->Put(kKey, 0, Frame()).ok());
  ASSERT_TRUE(client_->Get(kKey, 0).ok());
  EXPECT_FALSE(client_->Get(kKey, 1).ok());
  const std::string m = RawRequest(port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(StatusOf(m), 200);
  EXPECT_NE(m.find("cachegen_requests_total{method=\"PUT\",route=\"chunks\",code=\"201\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("cachegen_requests_total{method=\"GET\",route=\"chunks\",code=\"404\"} 1"), std::string::npos);
  EXPECT_NE(m.find("cachegen_chunk_hits_total 1"), std::string::npos);
  EXPECT_NE(m.find("cachegen_chunk_misses_total 1"), std::string::npos);
  EXPECT_NE(m.find("cachegen_request_duration_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
  EXPECT_NE(m.find("cachegen_response_bytes_total"), std::string::npos);
}

// One level-0 frame of 64 tokens x 8 layers at 8 bits/value: a few hundred KB.
Result<std::vector<std::vector<uint8_t>>> LargeFrame() {
  TestContext c = MakeContext(16);
  c.kv = std::move(SyntheticKV({8, 8, 128, 64}, DType::kF16, 3)).value();
  c.config.levels = 1;
  c.config.bits_per_value = 8;
  c.config.chunk_tokens = 64;
  CG_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> frames, Encoder::Create(c.config)->EncodeChunk(c.kv.view(), 0, 64));
  for (auto& f : frames) {
    CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bound, BindFrameToChunk(f, kKey));
    f = std::move(bound);
  }
  return frames;
}

TEST_P(ServiceTest, RateLimitShapesGets) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  ServiceOptions opts;
  opts.connection_rate = *ParseRateTrace("40mbit");  // 5 MB/s
  Restart(opts);
  Result<std::vector<std::vector<uint8_t>>> frames = LargeFrame();
  ASSERT_TRUE(frames.ok());
  ASSERT_TRUE(client_->Put(kKey, 0, (*frames)[0]).ok());
  const double bytes = static_cast<double>((*frames)[0].size());
  const auto t0 = std::chrono::steady_clock::now();
  auto got = client_->Get(kKey, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (*frames)[0]);
  // Lower bound only: the bucket may pass one 64 KB burst early.
  EXPECT_GE(s, (bytes - 65536) / 5e6) << bytes << " bytes";
}

TEST_P(ServiceTest, ProgressReadsReportAndCancel) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  Result<std::vector<std::vector<uint8_t>>> frames = LargeFrame();
  ASSERT_TRUE(frames.ok());
  const std::vector<uint8_t>& frame = (*frames)[0];
  ASSERT_GT(frame.size(), 100000u);
  ASSERT_TRUE(client_->Put(kKey, 0, frame).ok());
  ChunkStore* progressive = client_.get();

  std::vector<uint64_t> seen;
  auto got = progressive->GetWithProgress(kKey, 0, [&](uint64_t received) {
    seen.push_back(received);
    return true;
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, frame);
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), frame.size());

  // Abandoned after the first bytes: an error naming the cancel, not a miss,
  // not retried; the store keeps working.
  const uint64_t misses = client_->stats().misses;
  int calls = 0;
  auto cancelled = progressive->GetWithProgress(kKey, 0, [&](uint64_t) { return ++calls < 2; });
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), StatusCode::kIOError);
  EXPECT_NE(cancelled.status().message().find("cancelled"), std::string::npos) << cancelled.status().ToString();
  EXPECT_EQ(calls, 2) << "not sent again after the caller abandoned it";
  EXPECT_EQ(client_->stats().misses, misses);
  auto again = client_->Get(kKey, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, frame);
}

TEST_P(ServiceTest, FramesOverTheClientsLimitAreRefused) {
  if (GetParam() != "mem") GTEST_SKIP() << "backend-independent";
  Result<std::vector<std::vector<uint8_t>>> frames = LargeFrame();
  ASSERT_TRUE(frames.ok());
  const std::vector<uint8_t>& frame = (*frames)[0];
  ASSERT_TRUE(client_->Put(kKey, 0, frame).ok());
  ClientOptions small;
  small.max_frame_bytes = frame.size() - 1;
  auto limited = ConnectService(Url(), small);
  ASSERT_TRUE(limited.ok());
  const Status refused = (*limited)->Get(kKey, 0).status();
  EXPECT_EQ(refused.code(), StatusCode::kIOError);
  EXPECT_NE(refused.message().find("larger than the client's limit"), std::string::npos) << refused.ToString();
  EXPECT_EQ((*limited)->stats().misses, 1u);
  small.max_frame_bytes = frame.size();
  auto exact = ConnectService(Url(), small);
  ASSERT_TRUE(exact.ok());
  auto got = (*exact)->Get(kKey, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, frame);
}

INSTANTIATE_TEST_SUITE_P(Backends, ServiceTest, ::testing::Values("mem", "file"));

TEST(Rates, ParseRatesAndTraces) {
  EXPECT_DOUBLE_EQ(*ParseRate("1gbit"), 1.25e8);
  EXPECT_DOUBLE_EQ(*ParseRate("0.1gbit"), 1.25e7);
  EXPECT_DOUBLE_EQ(*ParseRate("64kbit"), 8000);
  EXPECT_DOUBLE_EQ(*ParseRate("800bit"), 100);
  for (const char* bad : {"", "1", "gbit", "-1gbit", "0gbit", "1gb", "1 gbit", "nanmbit"})
    EXPECT_FALSE(ParseRate(bad).ok()) << bad;
  auto t = ParseRateTrace("10gbit,0.1gbit@0.5");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 2u);
  EXPECT_DOUBLE_EQ((*t)[1].start_s, 0.5);
  EXPECT_DOUBLE_EQ((*t)[1].bytes_per_s, 1.25e7);
  for (const char* bad : {"1gbit@1", "1gbit,2gbit", "1gbit,2gbit@0", "1gbit,2gbit@x", "1gbit,"})
    EXPECT_FALSE(ParseRateTrace(bad).ok()) << bad;
  LinkShaper shaper(*t);
  EXPECT_DOUBLE_EQ(shaper.RateAt(0.4), 1.25e9);
  EXPECT_DOUBLE_EQ(shaper.RateAt(0.6), 1.25e7);
}

TEST(ServiceStart, RejectsTimeoutsOfZero) {
  auto store = OpenStore("mem://");
  ASSERT_TRUE(store.ok());
  ServiceOptions o;
  o.read_timeout_ms = 0;
  auto svc = Service::Start(store->get(), o);
  EXPECT_EQ(svc.status().code(), StatusCode::kInvalidArgument) << svc.status().ToString();
}

TEST(ConnectService, RejectsBadUrls) {
  for (const char* bad : {"", "127.0.0.1:80", "https://h:1", "http://h", "http://h:0", "http://h:99999", "http://:80",
                          "http://h:80/x"})
    EXPECT_FALSE(ConnectService(bad).ok()) << bad;
  auto down = ConnectService("http://127.0.0.1:1");
  ASSERT_TRUE(down.ok());
  EXPECT_EQ((*down)->Get(kKey, 0).status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace cachegen
