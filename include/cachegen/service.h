// The chunk service: a ChunkStore behind HTTP/1.1 (docs/SERVICE.md), its
// client (a ChunkStore that talks to a service), and link emulation.
//
// Endpoints: PUT/GET/HEAD/DELETE /v1/chunks/{key}/{level}, POST /v1/lookup,
// GET /healthz, GET /metrics (Prometheus text).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen {

// A piecewise-constant rate over time: step i holds from start_s on.
struct RateStep {
  double start_s = 0;
  double bytes_per_s = 0;  // > 0
};

// Parses a rate ("1gbit", "100mbit", "0.1gbit", "64kbit", "5000bit"; SI
// prefixes, bits per second) into bytes per second.
Result<double> ParseRate(std::string_view text);
// Parses a trace: comma-separated "RATE[@SECONDS]" steps with increasing
// start times, the first at 0 ("10gbit,0.1gbit@0.5": 10 Gbit/s, then 0.1 from 0.5 s).
Result<std::vector<RateStep>> ParseRateTrace(std::string_view text);

// A token bucket whose rate follows a trace, timed from construction or
// Restart(). Acquire blocks the caller until `bytes` may pass. The bucket
// holds at most `burst_bytes` of unused credit. Thread-safe: one shaper
// shared by several connections emulates one link they share.
class LinkShaper {
 public:
  explicit LinkShaper(std::vector<RateStep> trace, uint64_t burst_bytes = 64 * 1024);
  void Restart();
  void Acquire(uint64_t bytes);
  double RateAt(double t_s) const;  // bytes/s at t seconds after the start

 private:
  std::vector<RateStep> trace_;
  double burst_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  double next_free_s_ = 0;  // time (since start) the link is free again
};

struct ServiceOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port (see Service::port)
  // Bearer token required for PUT and DELETE (and reads with auth_reads).
  // Empty: no authentication at all.
  std::string token;
  bool auth_reads = false;
  uint64_t max_body_bytes = 64ull << 20;  // larger PUT/lookup bodies get 413
  int read_timeout_ms = 5000;             // a client that stalls longer is dropped
  int write_timeout_ms = 5000;
  uint32_t threads = 64;  // requests handled at once (idle and slow connections hold none)
  uint32_t max_connections = 4096;        // open at once; more are closed as they are accepted
  uint32_t max_connections_per_ip = 256;  // open at once from one client address
  // Request body bytes being received or handled at once, all connections
  // together (at least max_body_bytes); a body that does not fit gets 503.
  uint64_t max_inflight_body_bytes = 256ull << 20;
  // Per connection: GET bodies are sent through a token bucket following this
  // trace (timed from the connection's first request). Empty: unlimited.
  std::vector<RateStep> connection_rate;
  // One bucket shared by every connection (a link), in addition; may be null.
  std::shared_ptr<LinkShaper> link;
};

class Service {
 public:
  // Binds and starts serving `store` (not owned; must outlive the Service)
  // on background threads. kIOError when the address cannot be bound;
  // kInvalidArgument for a timeout <= 0.
  static Result<std::unique_ptr<Service>> Start(ChunkStore* store, const ServiceOptions& options);
  virtual ~Service() = default;
  virtual int port() const = 0;
  // Stops accepting and waits for the serving threads. Idempotent.
  virtual void Stop() = 0;
  // Blocks until Stop() is called (from another thread or a signal handler).
  virtual void Wait() = 0;
  virtual std::string MetricsText() const = 0;
};

struct ClientOptions {
  std::string token;  // sent as "Authorization: Bearer <token>" when not empty
  int connect_timeout_ms = 2000;  // to open a connection (name lookup not included)
  int read_timeout_ms = 10000;    // for each receive: a server silent this long has stalled
  int write_timeout_ms = 10000;   // to send a whole request, body included
  // To send a request and receive its whole answer, as a bound over the two
  // above: a server that sends a byte now and then (each receive within
  // read_timeout_ms) is cut off here. Not sent again. 0 = unbounded.
  int request_timeout_ms = 60000;
  // A chunk larger than this is refused as it arrives (kIOError), so that a
  // broken or hostile server cannot make the client allocate without bound;
  // the service's own limit on stored frames is ServiceOptions::max_body_bytes.
  uint64_t max_frame_bytes = 64ull << 20;
};

// A ChunkStore backed by a cachegen service at `url` ("http://host:port").
// Thread-safe: concurrent calls use separate keep-alive connections. Reads
// are checked with InspectFrame (payload checksums are verified on decode);
// a frame that fails is a miss counted in stats().corrupt. HTTP 404 is
// kNotFound; 401/403 and other 4xx are kInvalidArgument; network failures,
// malformed or truncated answers, timeouts and 5xx are kIOError. A request
// that failed in transport is sent once more on a new connection (every
// request is idempotent), unless no connection could be made, the caller
// abandoned it, the answer was over max_frame_bytes or request_timeout_ms
// ran out. LookupPrefix on this store is one POST /v1/lookup.
// kInvalidArgument for a URL that is not http://HOST:PORT, a connect, read
// or write timeout <= 0, or a request timeout < 0.
Result<std::unique_ptr<ChunkStore>> ConnectService(const std::string& url, const ClientOptions& options = {});

}  // namespace cachegen
