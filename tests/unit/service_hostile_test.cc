// The chunk service against hostile clients, bounded and on loopback:
// unauthenticated bodies never read, bodies in flight under their budget,
// idle and slowloris connections that hold no worker, per-address
// connection limits, and HTTP framing the server must refuse.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cachegen/service.h"
#include "cachegen/store.h"
#include "service_util.h"

namespace cachegen {
namespace {

using namespace testing_service;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "s3cret-token";
const std::string kPath = "/v1/chunks/00112233445566778899aabbccddeeff/0";

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class HostileClients : public ::testing::Test {
 protected:
  void Start(ServiceOptions opts) {
    store_ = std::move(OpenStore("mem://")).value();
    opts.token = kToken;
    auto svc = Service::Start(store_.get(), opts);
    ASSERT_TRUE(svc.ok()) << svc.status().ToString();
    service_ = std::move(svc).value();
  }
  void TearDown() override {
    for (int fd : open_) ::close(fd);
    if (service_) service_->Stop();
  }
  int port() const { return service_->port(); }
  // A connection kept open until the test ends.
  int Hold(const char* from = nullptr) {
    const int fd = OpenLoopback(port(), 3000, from);
    if (fd >= 0) open_.push_back(fd);
    return fd;
  }
  static void Send(int fd, const std::string& bytes) { ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // What the server sends on fd until it closes or 3 s pass.
  static std::string Receive(int fd) {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
    return out;
  }
  int Healthz() {
    return StatusOf(RawRequest(port(), "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  }

  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<Service> service_;
  std::vector<int> open_;
};

// A PUT without the token is answered 401 on its header: the body it
// announces (60 MB here) is never waited for or buffered.
TEST_F(HostileClients, UnauthenticatedBodiesAreNeverRead) {
  Start({});
  const int fd = Hold();
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  Send(fd, "PUT " + kPath + " HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n");
  const std::string answer = Receive(fd);
  EXPECT_EQ(StatusOf(answer), 401) << answer;
  EXPECT_LT(SecondsSince(t0), 2.0) << "the server waited for the body";
  EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
  EXPECT_NE(service_->MetricsText().find("code=\"401\"} 1"), std::string::npos) << service_->MetricsText();
}

// Bodies being received are reserved from one budget: once announced
// bodies fill it, the next one is refused (503, Retry-After) before any of
// it is read; when they end, the budget is free again.
TEST_F(HostileClients, BodiesInFlightStayWithinTheirBudget) {
  ServiceOptions opts;
  opts.max_body_bytes = 1 << 20;
  opts.max_inflight_body_bytes = 2 << 20;
  opts.read_timeout_ms = 1000;
  Start(opts);
  const std::string head = "PUT " + kPath + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + kToken +
                           "\r\nContent-Length: " + std::to_string(1 << 20) + "\r\n\r\n";
  const int a = Hold(), b = Hold();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  Send(a, head);
  Send(b, head);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string refused = RawRequest(port(), head);
  EXPECT_EQ(StatusOf(refused), 503) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  // The two stalled bodies time out (400) and free the budget.
  EXPECT_EQ(StatusOf(Receive(a)), 400);
  EXPECT_EQ(StatusOf(Receive(b)), 400);
  const std::string later = RawRequest(port(), "PUT " + kPath + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                                   kToken + "\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
  EXPECT_EQ(StatusOf(later), 400) << later;  // read and judged: not a frame
}

// Connections that are idle, or that send their header a byte at a time,
// hold no worker: with the fewest workers (2), honest requests are answered
// at once next to them. A trickled header is cut off at the read timeout,
// however often its bytes come.
TEST_F(HostileClients, IdleAndSlowlorisConnectionsHoldNoWorker) {
  ServiceOptions opts;
  opts.threads = 2;
  opts.read_timeout_ms = 1500;
  Start(opts);
  for (int i = 0; i < 40; ++i) ASSERT_GE(Hold(), 0);
  std::vector<int> slow;
  for (int i = 0; i < 20; ++i) {
    slow.push_back(Hold());
    ASSERT_GE(slow.back(), 0);
  }
  const std::string header = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; at < header.size() && !stop; ++at) {
      for (int fd : slow) Send(fd, header.substr(at, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  double worst = 0;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = Clock::now();
    EXPECT_EQ(Healthz(), 200);
    worst = std::max(worst, SecondsSince(t0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LT(worst, 1.0) << "an honest request waited behind idle or slow connections";
  // The trickled headers are not done after 1.5 s: 408, well before they would end (7 s).
  const auto t0 = Clock::now();
  for (int fd : slow) {
    const std::string answer = Receive(fd);
    EXPECT_TRUE(answer.empty() || StatusOf(answer) == 408) << answer;
  }
  EXPECT_LT(SecondsSince(t0), 3.0);
  stop = true;
  trickle.join();
}

// One address may hold only so many connections; others are not affected.
TEST_F(HostileClients, ConnectionsPerAddressAreLimited) {
  ServiceOptions opts;
  opts.max_connections_per_ip = 4;
  Start(opts);
  for (int i = 0; i < 4; ++i) ASSERT_GE(Hold("127.0.0.2"), 0);
  const int extra = Hold("127.0.0.2");
  ASSERT_GE(extra, 0);  // the kernel accepts it; the server closes it at once
  Send(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Receive(extra), "");
  EXPECT_EQ(Healthz(), 200);  // from 127.0.0.1
}

// Framing and headers HTTP/1.1 forbids, and non-canonical chunk paths.
TEST_F(HostileClients, AmbiguousRequestsAre400) {
  Start({});
  const std::string auth = std::string("Authorization: Bearer ") + kToken + "\r\n";
  auto put = [&](const std::string& path, const std::string& headers) {
    return StatusOf(RawRequest(port(), "PUT " + path + " HTTP/1.1\r\nHost: x\r\n" + headers +
                                           "Connection: close\r\n\r\nabc"));
  };
  EXPECT_EQ(put(kPath, auth + "Transfer-Encoding: xchunked\r\nContent-Length: 3\r\n"), 400);
  EXPECT_EQ(put(kPath, auth + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n"), 400);
  EXPECT_EQ(put(kPath, auth + "Authorization: Bearer wrong\r\nContent-Length: 3\r\n"), 400);
  EXPECT_EQ(put(kPath, "Authorization: Bearer wrong\r\n" + auth + "Content-Length: 3\r\n"), 400);
  EXPECT_EQ(put("/v1/chunks/00112233445566778899aabbccddeeff/00", auth + "Content-Length: 3\r\n"), 400);
  EXPECT_EQ(put("/v1/chunks/00112233445566778899AABBCCDDEEFF/0", auth + "Content-Length: 3\r\n"), 400);
  EXPECT_EQ(StatusOf(RawRequest(port(), "GET /v1/chunks/00112233445566778899aabbccddeeff/01 HTTP/1.1\r\nHost: "
                                        "x\r\nConnection: close\r\n\r\n")),
            400);
  EXPECT_FALSE(store_->Size(*ChunkKey::FromHex("00112233445566778899aabbccddeeff"), 0).ok());
}

// A store whose backend is down, with the errors a backend writes: paths
// and hosts of the server's machine.
class DownStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::atomic<bool> down{false};
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    if (down) return Status::IOError("open /srv/secret/cache/00/x.0: Input/output error");
    return ForwardingStore::Get(key, level);
  }
  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    if (down) return Status::IOError("stat /srv/secret/cache/00/x.0: Input/output error");
    return ForwardingStore::Size(key, level);
  }
};

// A store that is down: GET is 503 with Retry-After, saying nothing of the
// server's paths; /readyz says not ready while /healthz (liveness) says ok.
TEST_F(HostileClients, AStoreThatIsDownIsNotReadyAndHidesItsPaths) {
  auto mem = OpenStore("mem://");
  ASSERT_TRUE(mem.ok());
  DownStore store(mem->get());
  auto svc = Service::Start(&store, ServiceOptions{});
  ASSERT_TRUE(svc.ok());
  const int p = (*svc)->port();
  auto get = [p](const std::string& path) {
    return RawRequest(p, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  };
  EXPECT_EQ(StatusOf(get("/readyz")), 200);
  store.down = true;
  const std::string chunk = get(kPath);
  EXPECT_EQ(StatusOf(chunk), 503) << chunk;
  EXPECT_EQ(chunk.find("/srv"), std::string::npos) << chunk;
  EXPECT_NE(chunk.find("Retry-After: 1"), std::string::npos) << chunk;
  const std::string ready = get("/readyz");
  EXPECT_EQ(StatusOf(ready), 503) << ready;
  EXPECT_EQ(ready.find("/srv"), std::string::npos) << ready;
  EXPECT_EQ(StatusOf(get("/healthz")), 200);
  store.down = false;
  EXPECT_EQ(StatusOf(get("/readyz")), 200);
  (*svc)->Stop();
}

}  // namespace
}  // namespace cachegen
