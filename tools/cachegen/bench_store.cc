// `cachegen bench-store`: put/get throughput and latency percentiles of one
// or more chunk stores, side by side in one run; with --service, a load test
// of the HTTP chunk service over each store (N clients x M mixed requests).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/codec.h"
#include "cachegen/command.h"
#include "cachegen/service.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"

namespace cachegen::cli {
namespace {

struct BenchStoreArgs {
  std::vector<std::string> uris;
  uint64_t frame_bytes = 256 * 1024;
  uint32_t ops = 200;
  uint32_t threads = 1;
  bool json = false;
  bool service = false;
  uint32_t requests = 1000;
  uint32_t idle = 0;       // --service: idle connections held open next to the clients
  uint32_t slowloris = 0;  // --service: connections sending a request header a byte a second
  std::string synthetic = "4,8,128,64";
};

// Hostile connections next to the load (--idle, --slowloris), from the
// loopback addresses 127.0.0.2 and up, 128 per address (under the service's
// default per-address limit), so they test holding, not that limit. Each
// one the server closes is opened again, as an attacker would.
class HostileLoad {
 public:
  struct Counts {
    uint64_t opened = 0;
    uint64_t closed = 0;
  };
  HostileLoad(int port, uint32_t idle, uint32_t slow) : port_(port) {
    if (idle + slow == 0) return;
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;  // both ends of every connection are in this process
      setrlimit(RLIMIT_NOFILE, &lim);
    }
    conns_.resize(idle + slow);
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      conns_[i].slow = i >= idle;
      Open(i);
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~HostileLoad() { Stop(); }
  Counts Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (Conn& c : conns_)
      if (c.fd >= 0) ::close(c.fd);
    conns_.clear();
    return counts_;
  }

 private:
  struct Conn {
    int fd = -1;
    bool slow = false;
    size_t sent = 0;  // header bytes sent
  };
  void Open(uint32_t i) {
    Conn& c = conns_[i];
    c.sent = 0;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return;
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + i / 128);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port_));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(c.fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
        ::connect(c.fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    ++counts_.opened;
  }
  // Every second: a header byte on each slow connection; connections the
  // server closed (or that could not be opened) are opened again.
  void Run() {
    static constexpr std::string_view kHeader =
        "GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: slowloris-slowloris-slowloris\r\n\r\n";
    while (!stop_) {
      for (uint32_t i = 0; i < conns_.size() && !stop_; ++i) {
        Conn& c = conns_[i];
        if (c.fd >= 0) {
          pollfd p{c.fd, POLLIN | POLLRDHUP, 0};
          char b[512];
          const bool gone = ::poll(&p, 1, 0) > 0 && ::recv(c.fd, b, sizeof b, MSG_DONTWAIT) <= 0;
          const bool failed = !gone && c.slow && c.sent < kHeader.size() - 1 &&
                              ::send(c.fd, kHeader.data() + c.sent++, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1;
          if (!gone && !failed) continue;
          ::close(c.fd);
          ++counts_.closed;
        }
        Open(i);
      }
      for (int t = 0; t < 10 && !stop_; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const int port_;
  std::vector<Conn> conns_;
  Counts counts_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --service: the store behind an in-process `cachegen serve` on a loopback
// port, `threads` clients (one connection pool each) sending `requests`
// mixed requests each: GET of a stored chunk 50 %, GET of an absent one 10 %,
// HEAD 15 %, PUT 15 %, DELETE of the client's own PUT 5 %, lookup of 4 keys
// 5 %. An error is any answer other than the one expected (a stored chunk
// missing, an absent one found, a refused write...).
int RunServiceLoad(const BenchStoreArgs& a, const std::string& uri, nlohmann::json* out) {
  Result<KVTensor> kv = LoadInput("synthetic:" + a.synthetic);
  if (!kv.ok()) return Fail(kv.status());
  CodecConfig cfg;
  cfg.chunk_tokens = kv->shape().tokens;
  cfg.levels = 1;
  Result<Encoder> enc = Encoder::Create(cfg);
  if (!enc.ok()) return Fail(enc.status());
  Result<std::vector<std::vector<uint8_t>>> frames = enc->EncodeChunk(kv->view(), 0, kv->shape().tokens);
  if (!frames.ok()) return Fail(frames.status());
  const std::vector<uint8_t>& frame = (*frames)[0];

  auto s = OpenStore(uri);
  if (!s.ok()) return Fail(s.status());
  ServiceOptions sopts;
  sopts.token = "bench-store-load";
  sopts.threads = a.threads + 4;
  Result<std::unique_ptr<Service>> svc = Service::Start(s->get(), sopts);
  if (!svc.ok()) return Fail(svc.status());
  const std::string url = "http://127.0.0.1:" + std::to_string((*svc)->port());
  ClientOptions copts;
  copts.token = sopts.token;

  std::mt19937_64 rng(std::random_device{}());
  auto random_key = [](std::mt19937_64& r) {
    ChunkKey k;
    for (auto& b : k.bytes) b = static_cast<uint8_t>(r());
    return k;
  };
  // Frames are bound to the key they are stored under (BindFrameToChunk),
  // as the service requires.
  std::vector<ChunkKey> stored(256);
  std::vector<std::vector<uint8_t>> stored_frames(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    stored[i] = random_key(rng);
    Result<std::vector<uint8_t>> bound = BindFrameToChunk(frame, stored[i]);
    if (!bound.ok()) return Fail(bound.status());
    stored_frames[i] = std::move(bound).value();
    Status st = (*s)->Put(stored[i], 0, stored_frames[i]);
    if (!st.ok()) return Fail(st);
  }
  HostileLoad attack((*svc)->port(), a.idle, a.slowloris);

  enum Op { kGetHit, kGetMiss, kHead, kPut, kDelete, kLookup, kOps };
  const char* names[kOps] = {"get", "get-miss", "head", "put", "delete", "lookup"};
  std::vector<std::vector<double>> lat(kOps);
  std::vector<uint64_t> errors(kOps, 0), count(kOps, 0);
  std::vector<std::string> first_error;
  std::mutex mu;
  std::vector<ChunkKey> put_keys;  // removed afterwards
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (uint32_t c = 0; c < a.threads; ++c)
    clients.emplace_back([&, seed = rng()] {
      std::mt19937_64 r(seed);
      std::vector<std::vector<double>> my_lat(kOps);
      std::vector<uint64_t> my_err(kOps, 0);
      std::vector<ChunkKey> mine;
      std::string why;
      auto client = ConnectService(url, copts);
      if (!client.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++errors[kGetHit];
        first_error.push_back(client.status().ToString());
        return;
      }
      ChunkStore& store = **client;
      for (uint32_t i = 0; i < a.requests; ++i) {
        const uint32_t pick = static_cast<uint32_t>(r() % 100);
        Op op = pick < 50 ? kGetHit : pick < 60 ? kGetMiss : pick < 75 ? kHead : pick < 90 ? kPut
              : pick < 95 ? kDelete : kLookup;
        if (op == kDelete && mine.empty()) op = kPut;
        std::vector<uint8_t> to_put;
        if (op == kPut) {
          mine.push_back(random_key(r));
          to_put = *BindFrameToChunk(frame, mine.back());
        }
        const size_t hit = r() % stored.size();
        const auto start = std::chrono::steady_clock::now();
        bool ok = false;
        switch (op) {
          case kGetHit: {
            auto got = store.Get(stored[hit], 0);
            ok = got.ok() && *got == stored_frames[hit];
            if (!ok) why = got.ok() ? "GET returned other bytes" : got.status().ToString();
            break;
          }
          case kGetMiss: {
            auto got = store.Get(random_key(r), 0);
            ok = got.status().code() == StatusCode::kNotFound;
            if (!ok) why = "GET of an absent chunk: " + got.status().ToString();
            break;
          }
          case kHead: {
            auto size = store.Size(stored[hit], 0);
            ok = size.ok() && *size == stored_frames[hit].size();
            if (!ok) why = "HEAD: " + size.status().ToString();
            break;
          }
          case kPut: {
            Status st = store.Put(mine.back(), 0, to_put);
            ok = st.ok();
            if (!ok) why = "PUT: " + st.ToString();
            break;
          }
          case kDelete: {
            Status st = store.Delete(mine.back(), 0);
            mine.pop_back();
            ok = st.ok();
            if (!ok) why = "DELETE: " + st.ToString();
            break;
          }
          case kLookup: {
            std::vector<ChunkKey> keys;
            for (int k = 0; k < 4; ++k) keys.push_back(stored[r() % stored.size()]);
            ok = LookupPrefix(store, keys, 1).size() == keys.size();
            if (!ok) why = "lookup found less than was stored";
            break;
          }
          case kOps:
            break;
        }
        my_lat[op].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        if (!ok) {
          ++my_err[op];
          why = "request " + std::to_string(i) + " of a client: " + why;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      for (int op = 0; op < kOps; ++op) {
        lat[op].insert(lat[op].end(), my_lat[op].begin(), my_lat[op].end());
        errors[op] += my_err[op];
      }
      if (my_err != std::vector<uint64_t>(kOps, 0)) first_error.push_back(why);
      put_keys.insert(put_keys.end(), mine.begin(), mine.end());
    });
  for (auto& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const HostileLoad::Counts attacked = attack.Stop();
  for (const auto& k : put_keys) (void)(*s)->Delete(k, 0);
  for (const auto& k : stored) (void)(*s)->Delete(k, 0);
  (*svc)->Stop();

  std::vector<double> all;
  uint64_t total_errors = 0;
  nlohmann::json j{{"uri", (*s)->uri()},       {"service", true},  {"clients", a.threads},
                   {"requests_per_client", a.requests}, {"frame_bytes", frame.size()}, {"seconds", seconds},
                   {"idle", a.idle}, {"slowloris", a.slowloris}, {"attack_connections", attacked.opened},
                   {"attack_closed_by_server", attacked.closed}};
  if (!a.json)
    std::printf("%s via HTTP service: %u clients x %u mixed requests, frame %zu bytes; next to %u idle and %u "
                "slowloris connections (%llu opened, %llu closed by the server)\n%-9s %8s %9s %9s %7s\n",
                (*s)->uri().c_str(), a.threads, a.requests, frame.size(), a.idle, a.slowloris,
                static_cast<unsigned long long>(attacked.opened), static_cast<unsigned long long>(attacked.closed),
                "op", "requests", "p50 us", "p99 us", "errors");
  for (int op = 0; op < kOps; ++op) {
    std::sort(lat[op].begin(), lat[op].end());
    all.insert(all.end(), lat[op].begin(), lat[op].end());
    total_errors += errors[op];
    j["ops"][names[op]] = {{"requests", lat[op].size()}, {"p50_us", Percentile(lat[op], 0.5)},
                           {"p99_us", Percentile(lat[op], 0.99)}, {"errors", errors[op]}};
    if (!a.json)
      std::printf("%-9s %8zu %9.0f %9.0f %7llu\n", names[op], lat[op].size(), Percentile(lat[op], 0.5),
                  Percentile(lat[op], 0.99), static_cast<unsigned long long>(errors[op]));
  }
  std::sort(all.begin(), all.end());
  j["all"] = {{"requests", all.size()}, {"requests_per_s", static_cast<double>(all.size()) / seconds},
              {"p50_us", Percentile(all, 0.5)}, {"p99_us", Percentile(all, 0.99)}, {"errors", total_errors}};
  if (!first_error.empty()) j["first_error"] = first_error.front();
  if (!a.json) {
    std::printf("%-9s %8zu %9.0f %9.0f %7llu   (%.0f requests/s over %.1f s)\n", "all", all.size(),
                Percentile(all, 0.5), Percentile(all, 0.99), static_cast<unsigned long long>(total_errors),
                static_cast<double>(all.size()) / seconds, seconds);
    if (!first_error.empty()) std::printf("first error: %s\n", first_error.front().c_str());
  }
  out->push_back(j);
  return total_errors == 0 ? 0 : 1;
}

struct Phase {
  double seconds = 0;
  uint64_t ok = 0, errors = 0;
  double p50_us = 0, p99_us = 0;
};

// Runs op(i) for i in [0, n) on `threads` threads; per-op latency percentiles.
template <typename Op>
Phase RunPhase(uint32_t n, uint32_t threads, const Op& op) {
  std::vector<double> lat(n);
  std::atomic<uint32_t> next{0};
  std::atomic<uint64_t> ok{0}, errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (uint32_t i; (i = next.fetch_add(1)) < n;) {
        const auto s = std::chrono::steady_clock::now();
        (op(i) ? ok : errors)++;
        lat[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count();
      }
    });
  for (auto& th : pool) th.join();
  Phase p;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.ok = ok;
  p.errors = errors;
  std::sort(lat.begin(), lat.end());
  p.p50_us = Percentile(lat, 0.5);
  p.p99_us = Percentile(lat, 0.99);
  return p;
}

int RunBenchStore(const BenchStoreArgs& a) {
  if (a.ops == 0 || a.threads == 0 || a.frame_bytes == 0 || a.requests == 0)
    return Fail(Status::InvalidArgument("--ops, --threads, --requests and --frame-bytes must be positive"));
  if (a.service) {
    nlohmann::json out = nlohmann::json::array();
    int rc = 0;
    for (const std::string& uri : a.uris) {
      const int r = RunServiceLoad(a, uri, &out);
      if (r != 0 && r != 1) return r;
      rc |= r;
    }
    if (a.json) std::printf("%s\n", nlohmann::json{{"stores", out}}.dump().c_str());
    return rc;
  }
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> frame(a.frame_bytes);
  for (auto& b : frame) b = static_cast<uint8_t>(rng());
  nlohmann::json out = nlohmann::json::array();
  if (!a.json)
    std::printf("%-44s %4s %10s %9s %9s %9s %6s\n", "store", "op", "ops/s", "MB/s", "p50 us", "p99 us", "errors");
  for (const std::string& uri : a.uris) {
    auto s = OpenStore(uri);
    if (!s.ok()) return Fail(s.status());
    ChunkStore& store = **s;
    std::vector<ChunkKey> keys(a.ops);  // fresh random keys: no collision with stored entries
    for (auto& k : keys)
      for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
    const Phase put = RunPhase(a.ops, a.threads, [&](uint32_t i) { return store.Put(keys[i], 0, frame).ok(); });
    const Phase get = RunPhase(a.ops, a.threads, [&](uint32_t i) {
      auto r = store.Get(keys[i], 0);
      return r.ok() && r->size() == frame.size();
    });
    for (const auto& k : keys) (void)store.Delete(k, 0);
    nlohmann::json j{{"uri", store.uri()}, {"frame_bytes", a.frame_bytes}, {"ops", a.ops}, {"threads", a.threads}};
    for (const auto& [name, p] : {std::pair{"put", put}, std::pair{"get", get}}) {
      const double ops_s = static_cast<double>(p.ok) / p.seconds;
      const double mb_s = ops_s * static_cast<double>(a.frame_bytes) / 1e6;
      j[name] = {{"ops_per_s", ops_s}, {"mb_per_s", mb_s}, {"p50_us", p.p50_us}, {"p99_us", p.p99_us}, {"errors", p.errors}};
      if (!a.json)
        std::printf("%-44s %4s %10.0f %9.1f %9.0f %9.0f %6llu\n", store.uri().substr(0, 44).c_str(), name, ops_s,
                    mb_s, p.p50_us, p.p99_us, static_cast<unsigned long long>(p.errors));
    }
    out.push_back(j);
  }
  if (a.json) std::printf("%s\n", nlohmann::json{{"stores", out}}.dump().c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(46, [](CLI::App& root) -> CommandRunner {
  auto args = std::make_shared<BenchStoreArgs>();
  CLI::App* sub = root.add_subcommand("bench-store", "Put/get throughput and p50/p99 latency of chunk stores");
  sub->add_option("--store", args->uris, "Store URI (repeat to compare several in one run)")->required();
  sub->add_option("--frame-bytes", args->frame_bytes, "Bytes per frame (at most 1 GiB)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--ops", args->ops, "Frames put, then got, per store")->capture_default_str();
  sub->add_option("--threads", args->threads, "Concurrent clients")->capture_default_str();
  sub->add_flag("--service", args->service,
                "Load-test the HTTP service over each store: --threads clients x --requests mixed requests "
                "(exit 1 on any error)");
  sub->add_option("--requests", args->requests, "With --service: requests per client")->capture_default_str();
  sub->add_option("--idle", args->idle,
                  "With --service: connections held open and idle meanwhile (reopened when the server closes them)")
      ->check(CLI::Range(0u, 8192u))
      ->capture_default_str();
  sub->add_option("--slowloris", args->slowloris,
                  "With --service: connections sending a request header a byte a second meanwhile (reopened when "
                  "closed)")
      ->check(CLI::Range(0u, 8192u))
      ->capture_default_str();
  sub->add_option("--synthetic", args->synthetic, "With --service: the chunk stored (L,H,D,T), one frame")
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return [sub, args] { return *sub ? std::optional<int>(RunBenchStore(*args)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
