// The HTTP chunk service (include/cachegen/service.h, docs/SERVICE.md).
#include <httplib.h>

#include <array>
#include <atomic>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cachegen/codec.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"

namespace cachegen {
namespace {

using Clock = std::chrono::steady_clock;

// Request latency buckets (seconds), Prometheus "le" bounds.
constexpr std::array<double, 12> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                             0.05,   0.1,   0.25,   0.5,   1.0,  2.5};

class Metrics {
 public:
  void Request(const std::string& method, const std::string& route, int code, uint64_t in_bytes,
               uint64_t out_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{method, route, code}];
    bytes_in_ += in_bytes;
    bytes_out_ += out_bytes;
  }
  void Duration(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < kBuckets.size(); ++i)
      if (seconds <= kBuckets[i]) ++buckets_[i];
    ++latency_count_;
    latency_sum_ += seconds;
  }
  void Hit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  void Miss() { misses_.fetch_add(1, std::memory_order_relaxed); }

  std::string Text(const StoreStats& store) const {
    std::string s;
    auto line = [&](const std::string& l) { s += l + "\n"; };
    std::lock_guard<std::mutex> lock(mu_);
    line("# HELP cachegen_requests_total HTTP requests by method, route and status code.");
    line("# TYPE cachegen_requests_total counter");
    for (const auto& [k, n] : requests_)
      line("cachegen_requests_total{method=\"" + std::get<0>(k) + "\",route=\"" + std::get<1>(k) + "\",code=\"" +
           std::to_string(std::get<2>(k)) + "\"} " + std::to_string(n));
    line("# HELP cachegen_request_bytes_total Request body bytes received.");
    line("# TYPE cachegen_request_bytes_total counter");
    line("cachegen_request_bytes_total " + std::to_string(bytes_in_));
    line("# HELP cachegen_response_bytes_total Response body bytes sent.");
    line("# TYPE cachegen_response_bytes_total counter");
    line("cachegen_response_bytes_total " + std::to_string(bytes_out_));
    line("# HELP cachegen_chunk_hits_total Chunk GET/HEAD requests answered from the store.");
    line("# TYPE cachegen_chunk_hits_total counter");
    line("cachegen_chunk_hits_total " + std::to_string(hits_.load()));
    line("# HELP cachegen_chunk_misses_total Chunk GET/HEAD requests for absent or corrupt chunks.");
    line("# TYPE cachegen_chunk_misses_total counter");
    line("cachegen_chunk_misses_total " + std::to_string(misses_.load()));
    line("# HELP cachegen_store_corrupt_total Stored chunks that failed verification on read.");
    line("# TYPE cachegen_store_corrupt_total counter");
    line("cachegen_store_corrupt_total " + std::to_string(store.corrupt));
    line("# HELP cachegen_store_evictions_total Chunks evicted by the store's size budget.");
    line("# TYPE cachegen_store_evictions_total counter");
    line("cachegen_store_evictions_total " + std::to_string(store.evictions));
    line("# HELP cachegen_request_duration_seconds Time from request headers to the last response byte.");
    line("# TYPE cachegen_request_duration_seconds histogram");
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      char le[32];
      std::snprintf(le, sizeof le, "%g", kBuckets[i]);
      line(std::string("cachegen_request_duration_seconds_bucket{le=\"") + le + "\"} " + std::to_string(buckets_[i]));
    }
    line("cachegen_request_duration_seconds_bucket{le=\"+Inf\"} " + std::to_string(latency_count_));
    char sum[64];
    std::snprintf(sum, sizeof sum, "%.9g", latency_sum_);
    line(std::string("cachegen_request_duration_seconds_sum ") + sum);
    line("cachegen_request_duration_seconds_count " + std::to_string(latency_count_));
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, uint64_t> requests_;
  uint64_t bytes_in_ = 0, bytes_out_ = 0;
  std::array<uint64_t, kBuckets.size()> buckets_{};
  uint64_t latency_count_ = 0;
  double latency_sum_ = 0;
  std::atomic<uint64_t> hits_{0}, misses_{0};
};

// Per serving thread: when the current request started, and the connection's
// rate limiter (httplib serves one connection per thread until it closes).
struct ThreadState {
  Clock::time_point start{};
  bool started = false;
  uint64_t out_bytes = 0;
  std::string peer;
  std::unique_ptr<LinkShaper> shaper;
};
thread_local ThreadState tls;

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

void Error(httplib::Response& res, int code, const std::string& message) {
  res.status = code;
  // After a malformed request the connection's byte stream cannot be trusted.
  if (code == 400 || code == 408 || code == 413) res.set_header("Connection", "close");
  res.set_content(nlohmann::json{{"error", message}}.dump() + "\n", "application/json");
}

std::string Route(const std::string& path) {
  if (path.rfind("/v1/chunks/", 0) == 0) return "chunks";
  if (path == "/v1/lookup") return "lookup";
  if (path == "/healthz") return "healthz";
  if (path == "/metrics") return "metrics";
  return "other";
}

class HttpService final : public Service {
 public:
  HttpService(ChunkStore* store, ServiceOptions options) : store_(store), options_(std::move(options)) {}
  ~HttpService() override { Stop(); }

  Status Init() {
    const uint32_t threads = std::max<uint32_t>(options_.threads, 2);
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_payload_max_length(options_.max_body_bytes);
    server_.set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
    server_.set_write_timeout(std::chrono::milliseconds(options_.write_timeout_ms));
    server_.set_keep_alive_max_count(100000);
    server_.set_keep_alive_timeout(10);
    server_.set_tcp_nodelay(true);
    server_.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      tls.start = Clock::now();
      tls.started = true;
      tls.out_bytes = 0;
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Counters are taken just before the response goes out (httplib's
    // post-routing handler), so a client that has its answer sees it counted
    // in its next /metrics; httplib calls the logger only after the last byte
    // was written, which is where the duration is known.
    server_.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics_.Request(req.method, Route(req.path), res.status, req.body.size(),
                       tls.out_bytes ? tls.out_bytes : res.body.size());
      tls.out_bytes = 0;  // requests refused before routing do not reset it
    });
    server_.set_logger([this](const httplib::Request&, const httplib::Response&) {
      if (tls.started) metrics_.Duration(std::chrono::duration<double>(Clock::now() - tls.start).count());
      tls.started = false;
    });
    server_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      Error(res, 500, "internal error");
    });

    const std::string chunk = R"(/v1/chunks/([^/]*)/([^/]*))";
    server_.Get(chunk, [this](const httplib::Request& req, httplib::Response& res) { GetChunk(req, res); });
    server_.Put(chunk, [this](const httplib::Request& req, httplib::Response& res) { PutChunk(req, res); });
    server_.Delete(chunk, [this](const httplib::Request& req, httplib::Response& res) { DeleteChunk(req, res); });
    server_.Post("/v1/lookup", [this](const httplib::Request& req, httplib::Response& res) { Lookup(req, res); });
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(MetricsText(), "text/plain; version=0.0.4");
    });
    server_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) {
        const char* what = res.status == 413 ? "request body too large"
                           : res.status == 404 ? "no such endpoint"
                                               : "bad request";
        Error(res, res.status, what);
      }
    });

    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
      if (port_ <= 0) return Status::IOError("serve: cannot bind " + options_.host);
    } else {
      if (!server_.bind_to_port(options_.host, options_.port))
        return Status::IOError("serve: cannot bind " + options_.host + ":" + std::to_string(options_.port));
      port_ = options_.port;
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib's stop() is a no-op until the accept loop runs: wait for it.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    return Status::Ok();
  }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    server_.stop();
    if (thread_.joinable()) thread_.join();
    stop_cv_.notify_all();
  }

  void Wait() override {
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait(lock, [this] { return stopped_; });
  }

  std::string MetricsText() const override { return metrics_.Text(store_->stats()); }

 private:
  bool Authorized(const httplib::Request& req, httplib::Response& res, bool write) {
    if (options_.token.empty() || (!write && !options_.auth_reads)) return true;
    const std::string h = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (h.size() > kBearer.size() && h.compare(0, kBearer.size(), kBearer) == 0 &&
        ConstantTimeEqual(std::string_view(h).substr(kBearer.size()), options_.token))
      return true;
    res.set_header("WWW-Authenticate", "Bearer");
    Error(res, 401, h.empty() ? "missing bearer token" : "bad bearer token");
    return false;
  }

  // Parses {key}/{level} from the path; 400 on failure.
  bool ParseChunkPath(const httplib::Request& req, httplib::Response& res, ChunkKey* key, uint32_t* level) {
    Result<ChunkKey> k = ChunkKey::FromHex(req.matches[1].str());
    if (!k.ok()) {
      Error(res, 400, "bad chunk key (want 32 hex digits)");
      return false;
    }
    const std::string l = req.matches[2].str();
    unsigned v = 0;
    auto [p, ec] = std::from_chars(l.data(), l.data() + l.size(), v);
    if (l.empty() || ec != std::errc() || p != l.data() + l.size() || v >= kMaxChunkLevels) {
      Error(res, 400, "bad level (want 0.." + std::to_string(kMaxChunkLevels - 1) + ")");
      return false;
    }
    *key = *k;
    *level = v;
    return true;
  }

  void GetChunk(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(req, res, &key, &level)) return;
    if (req.method == "HEAD") {
      Result<uint64_t> size = store_->Size(key, level);
      if (!size.ok()) return StoreError(res, size.status(), false);  // a probe: not a hit or miss
      res.set_header("X-Chunk-Bytes", std::to_string(*size));
      res.status = 200;
      return;
    }
    Result<std::vector<uint8_t>> frame = store_->Get(key, level);
    if (!frame.ok()) return StoreError(res, frame.status(), true);
    metrics_.Hit();
    auto bytes = std::make_shared<std::vector<uint8_t>>(std::move(frame).value());
    tls.out_bytes = bytes->size();
    // The frame is sent from its own buffer (set_content would copy it
    // first); through the shapers 64 KiB at a time, else whole.
    const bool limited = !options_.connection_rate.empty() || options_.link;
    if (!options_.connection_rate.empty() && (tls.peer != req.remote_addr + ":" + std::to_string(req.remote_port) ||
                                              !tls.shaper)) {
      tls.peer = req.remote_addr + ":" + std::to_string(req.remote_port);
      tls.shaper = std::make_unique<LinkShaper>(options_.connection_rate);
    }
    LinkShaper* conn = options_.connection_rate.empty() ? nullptr : tls.shaper.get();
    std::shared_ptr<LinkShaper> link = options_.link;
    res.set_content_provider(bytes->size(), "application/octet-stream",
                             [bytes, conn, link, limited](size_t offset, size_t length, httplib::DataSink& sink) {
                               const size_t n = limited ? std::min<size_t>(length, 64 * 1024) : length;
                               if (conn) conn->Acquire(n);
                               if (link) link->Acquire(n);
                               return sink.write(reinterpret_cast<const char*>(bytes->data()) + offset, n);
                             });
  }

  void PutChunk(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, true)) return;
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(req, res, &key, &level)) return;
    const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(req.body.data()), req.body.size());
    Result<FrameInfo> info = InspectFrame(body);
    if (!info.ok()) return Error(res, 400, "body is not a valid frame: " + info.status().message());
    if (info->level != level)
      return Error(res, 400, "frame is level " + std::to_string(info->level) + ", path says " + std::to_string(level));
    if (info->bytes != body.size()) return Error(res, 400, "body has bytes after the frame");
    Status st = store_->Put(key, level, body);
    if (!st.ok()) return StoreError(res, st, false);
    res.status = 201;
  }

  void DeleteChunk(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, true)) return;
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(req, res, &key, &level)) return;
    Status st = store_->Delete(key, level);
    if (!st.ok()) return StoreError(res, st, false);
    res.status = 204;
  }

  void Lookup(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    nlohmann::json in = nlohmann::json::parse(req.body, nullptr, false);
    if (in.is_discarded() || !in.is_object()) return Error(res, 400, "body is not a JSON object");
    uint32_t levels = kMaxChunkLevels;
    if (in.contains("levels")) {
      if (!in["levels"].is_number_unsigned() || in["levels"].get<uint64_t>() < 1 ||
          in["levels"].get<uint64_t>() > kMaxChunkLevels)
        return Error(res, 400, "levels must be 1..8");
      levels = in["levels"].get<uint32_t>();
    }
    std::vector<ChunkKey> keys;
    if (in.contains("keys")) {
      if (!in["keys"].is_array()) return Error(res, 400, "keys must be an array of hex strings");
      for (const auto& k : in["keys"]) {
        if (!k.is_string()) return Error(res, 400, "keys must be an array of hex strings");
        Result<ChunkKey> key = ChunkKey::FromHex(k.get<std::string>());
        if (!key.ok()) return Error(res, 400, "bad chunk key (want 32 hex digits)");
        keys.push_back(*key);
      }
    } else if (in.contains("tokens")) {
      if (!in.contains("root") || !in["root"].is_string()) return Error(res, 400, "tokens need a root key");
      Result<ChunkKey> root = ChunkKey::FromHex(in["root"].get<std::string>());
      if (!root.ok()) return Error(res, 400, "bad root key (want 32 hex digits)");
      uint32_t T = kDefaultChunkTokens;
      if (in.contains("chunk_tokens")) {
        if (!in["chunk_tokens"].is_number_unsigned() || in["chunk_tokens"].get<uint64_t>() < 1 ||
            in["chunk_tokens"].get<uint64_t>() > (1u << 20))
          return Error(res, 400, "chunk_tokens must be 1..1048576");
        T = in["chunk_tokens"].get<uint32_t>();
      }
      if (!in["tokens"].is_array()) return Error(res, 400, "tokens must be an array of integers");
      std::vector<TokenId> tokens;
      tokens.reserve(in["tokens"].size());
      for (const auto& t : in["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX)
          return Error(res, 400, "tokens must be 32-bit integers");
        tokens.push_back(static_cast<TokenId>(t.get<int64_t>()));
      }
      keys = ChunkKeys(*root, tokens, T);
    } else {
      return Error(res, 400, "lookup needs \"keys\" or \"tokens\"");
    }
    const std::vector<CachedChunk> found = LookupPrefix(*store_, keys, levels);
    nlohmann::json out;
    out["cached"] = found.size();
    out["requested"] = keys.size();
    nlohmann::json chunks = nlohmann::json::array();
    for (const CachedChunk& c : found) chunks.push_back({{"key", c.key.Hex()}, {"sizes", c.level_bytes}});
    out["chunks"] = std::move(chunks);
    res.set_content(out.dump() + "\n", "application/json");
  }

  void StoreError(httplib::Response& res, const Status& st, bool read) {
    if (st.code() == StatusCode::kNotFound) {
      if (read) metrics_.Miss();
      return Error(res, 404, "not found");
    }
    if (read) metrics_.Miss();
    if (st.code() == StatusCode::kInvalidArgument) return Error(res, 400, st.message());
    return Error(res, st.code() == StatusCode::kIOError ? 503 : 500, st.message());
  }

  ChunkStore* store_;
  ServiceOptions options_;
  httplib::Server server_;
  Metrics metrics_;
  int port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

}  // namespace

Result<std::unique_ptr<Service>> Service::Start(ChunkStore* store, const ServiceOptions& options) {
  if (store == nullptr) return Status::InvalidArgument("serve: no store");
  auto service = std::make_unique<HttpService>(store, options);
  CG_RETURN_IF_ERROR(service->Init());
  return std::unique_ptr<Service>(std::move(service));
}

}  // namespace cachegen
