// The HTTP chunk service (include/cachegen/service.h, docs/SERVICE.md): its
// routes and metrics over HttpServer (Boost.Beast, like the client).
#include <array>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cachegen/codec.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "service/bearer.h"
#include "service/http_server.h"

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
  void LookupFailed() { lookup_failures_.fetch_add(1, std::memory_order_relaxed); }

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
    line("# HELP cachegen_chunk_hits_total Chunk GET requests answered from the store.");
    line("# TYPE cachegen_chunk_hits_total counter");
    line("cachegen_chunk_hits_total " + std::to_string(hits_.load()));
    line("# HELP cachegen_chunk_misses_total Chunk GET requests for absent or corrupt chunks.");
    line("# TYPE cachegen_chunk_misses_total counter");
    line("cachegen_chunk_misses_total " + std::to_string(misses_.load()));
    line("# HELP cachegen_lookup_store_errors_total Lookups the store could not answer for a chunk "
         "(the prefix ended there).");
    line("# TYPE cachegen_lookup_store_errors_total counter");
    line("cachegen_lookup_store_errors_total " + std::to_string(lookup_failures_.load()));
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
  std::atomic<uint64_t> hits_{0}, misses_{0}, lookup_failures_{0};
};

namespace http = boost::beast::http;

void Error(HttpReply& r, unsigned code, const std::string& message) {
  r.status = code;
  // After a malformed request the connection's byte stream cannot be trusted.
  if (code == 400 || code == 408 || code == 413) r.close = true;
  r.content_type = "application/json";
  r.text = nlohmann::json{{"error", message}}.dump() + "\n";
}

std::string Route(std::string_view path) {
  if (path.starts_with("/v1/chunks/")) return "chunks";
  if (path == "/v1/lookup") return "lookup";
  if (path == "/healthz") return "healthz";
  if (path == "/readyz") return "readyz";
  if (path == "/metrics") return "metrics";
  return "other";
}

class HttpService final : public Service {
 public:
  HttpService(ChunkStore* store, ServiceOptions options) : store_(store), options_(std::move(options)) {}
  ~HttpService() override { Stop(); }

  Status Init() {
    HttpServerOptions o;
    o.host = options_.host;
    o.port = options_.port;
    o.threads = options_.threads;
    o.max_body_bytes = options_.max_body_bytes;
    o.read_timeout_ms = options_.read_timeout_ms;
    o.write_timeout_ms = options_.write_timeout_ms;
    o.max_connections = options_.max_connections;
    o.max_connections_per_ip = options_.max_connections_per_ip;
    o.max_inflight_body_bytes = options_.max_inflight_body_bytes;
    o.connection_rate = options_.connection_rate;
    o.link = options_.link;
    HttpHandlers h;
    h.handle = [this](const HttpRequest& req, HttpReply& r) { Handle(req, r); };
    h.error = Error;
    // The token is checked on the header: an unauthenticated body is never read.
    h.admit = [this](const HttpRequest& req, HttpReply& r) {
      if (!HttpPath(req).starts_with("/v1/") || Authorized(req, r, NeedsWrite(req))) return true;
      metrics_.Request(std::string(req.method_string()), Route(HttpPath(req)), static_cast<int>(r.status), 0,
                       r.body_size());
      return false;
    };
    // Counted just before the answer goes out, so that a client that has
    // its answer sees it counted in its next /metrics.
    h.answered = [this](const HttpRequest& req, const HttpReply& r) {
      metrics_.Request(std::string(req.method_string()), Route(HttpPath(req)), static_cast<int>(r.status),
                       req.body().size(), r.body_size());
    };
    h.done = [this](double seconds) { metrics_.Duration(seconds); };
    Result<std::unique_ptr<HttpServer>> server = HttpServer::Start(o, std::move(h));
    if (!server.ok()) {
      const std::string message = "serve: " + server.status().message();
      return server.status().code() == StatusCode::kInvalidArgument ? Status::InvalidArgument(message)
                                                                     : Status::IOError(message);
    }
    server_ = std::move(server).value();
    return Status::Ok();
  }

  int port() const override { return server_->port(); }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    if (server_) server_->Stop();
    stopped_ = true;
    stop_cv_.notify_all();
  }

  void Wait() override {
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait(lock, [this] { return stopped_; });
  }

  std::string MetricsText() const override { return metrics_.Text(store_->stats()); }

 private:
  void Handle(const HttpRequest& req, HttpReply& r) {
    const std::string_view path = HttpPath(req);
    const http::verb m = req.method();
    constexpr std::string_view kChunks = "/v1/chunks/";
    if (path.substr(0, kChunks.size()) == kChunks) {
      const std::string_view rest = path.substr(kChunks.size());
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos || rest.find('/', slash + 1) != std::string_view::npos)
        return Error(r, 404, "no such endpoint");
      const std::string_view key = rest.substr(0, slash), level = rest.substr(slash + 1);
      if (m == http::verb::get || m == http::verb::head) return GetChunk(req, r, key, level);
      if (m == http::verb::put) return PutChunk(req, r, key, level);
      if (m == http::verb::delete_) return DeleteChunk(r, key, level);
      return NotAllowed(r, "GET, HEAD, PUT, DELETE");
    }
    if (path == "/v1/lookup") return m == http::verb::post ? Lookup(req, r) : NotAllowed(r, "POST");
    if (path == "/healthz" || path == "/metrics" || path == "/readyz") {
      if (m != http::verb::get && m != http::verb::head) return NotAllowed(r, "GET, HEAD");
      if (path == "/readyz") return Ready(r);
      if (path == "/healthz") {
        r.content_type = "text/plain";
        r.text = "ok\n";
      } else {
        r.content_type = "text/plain; version=0.0.4";
        r.text = MetricsText();
      }
      return;
    }
    Error(r, 404, "no such endpoint");
  }

  static void NotAllowed(HttpReply& r, const char* allow) {
    Error(r, 405, "method not allowed");
    r.headers.emplace_back("Allow", allow);
  }

  // Whether a request changes the store (PUT, DELETE), and so needs the token
  // even where reads do not.
  static bool NeedsWrite(const HttpRequest& req) {
    return req.method() == http::verb::put || req.method() == http::verb::delete_;
  }

  bool Authorized(const HttpRequest& req, HttpReply& r, bool write) {
    if (options_.token.empty() || (!write && !options_.auth_reads)) return true;
    const std::string_view h(req[http::field::authorization].data(), req[http::field::authorization].size());
    if (BearerTokenMatches(h, options_.token)) return true;
    Error(r, 401, h.empty() ? "missing bearer token" : "bad bearer token");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return false;
  }

  // Parses {key}/{level} of a chunk path; 400 on failure.
  static bool ParseChunkPath(std::string_view key_text, std::string_view level_text, HttpReply& r, ChunkKey* key,
                             uint32_t* level) {
    // Canonical forms only (lowercase hex, a level without leading zeros):
    // one chunk has one path.
    Result<ChunkKey> k = ChunkKey::FromHex(std::string(key_text));
    if (!k.ok() || k->Hex() != key_text) {
      Error(r, 400, "bad chunk key (want 32 lowercase hex digits)");
      return false;
    }
    unsigned v = 0;
    const char* end = level_text.data() + level_text.size();
    auto [p, ec] = std::from_chars(level_text.data(), end, v);
    if (level_text.empty() || ec != std::errc() || p != end || v >= kMaxChunkLevels ||
        (level_text.size() > 1 && level_text[0] == '0')) {
      Error(r, 400, "bad level (want 0.." + std::to_string(kMaxChunkLevels - 1) + ")");
      return false;
    }
    *key = *k;
    *level = v;
    return true;
  }

  void GetChunk(const HttpRequest& req, HttpReply& r, std::string_view key_text, std::string_view level_text) {
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(key_text, level_text, r, &key, &level)) return;
    if (req.method() == http::verb::head) {
      Result<uint64_t> size = store_->Size(key, level);
      if (!size.ok()) return StoreError(r, size.status(), false);  // a probe: not a hit or miss
      r.headers.emplace_back("X-Chunk-Bytes", std::to_string(*size));
      return;
    }
    Result<std::vector<uint8_t>> frame = store_->Get(key, level);
    if (!frame.ok()) return StoreError(r, frame.status(), true);
    metrics_.Hit();
    r.content_type = "application/octet-stream";
    r.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(frame).value());
    r.shaped = true;  // through the token buckets, where there are any
  }

  void PutChunk(const HttpRequest& req, HttpReply& r, std::string_view key_text, std::string_view level_text) {
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(key_text, level_text, r, &key, &level)) return;
    const std::span<const uint8_t> body(req.body().data(), req.body().size());
    Result<FrameInfo> info = VerifyFrame(body);
    if (!info.ok()) return Error(r, 400, "body is not a valid frame: " + info.status().message());
    if (info->level != level)
      return Error(r, 400, "frame is level " + std::to_string(info->level) + ", path says " + std::to_string(level));
    if (info->bytes != body.size()) return Error(r, 400, "body has bytes after the frame");
    // A frame proves which chunk it is (BindFrameToChunk): one bound to
    // another key, or to none, would be served as this chunk.
    if (!info->chunk_key) return Error(r, 400, "frame is not bound to a chunk key (format version 1)");
    if (*info->chunk_key != key)
      return Error(r, 400, "frame is bound to chunk " + info->chunk_key->Hex() + ", path says " + key.Hex());
    Status st = store_->Put(key, level, body);
    if (!st.ok()) return StoreError(r, st, false);
    r.status = 201;
  }

  void DeleteChunk(HttpReply& r, std::string_view key_text, std::string_view level_text) {
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(key_text, level_text, r, &key, &level)) return;
    Status st = store_->Delete(key, level);
    if (!st.ok()) return StoreError(r, st, false);
    r.status = 204;
  }

  void Lookup(const HttpRequest& req, HttpReply& res) {
    nlohmann::json in = nlohmann::json::parse(req.body().begin(), req.body().end(), nullptr, false);
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
    Status failed;
    const std::vector<CachedChunk> found = LookupPrefix(*store_, keys, levels, &failed);
    nlohmann::json out;
    // The store could not answer for a chunk: the prefix up to it, and why
    // it ended there, so that a client does not take it for a cold cache.
    if (!failed.ok()) {
      metrics_.LookupFailed();
      out["error"] = failed.ToString();
    }
    out["cached"] = found.size();
    out["requested"] = keys.size();
    nlohmann::json chunks = nlohmann::json::array();
    for (const CachedChunk& c : found) chunks.push_back({{"key", c.key.Hex()}, {"sizes", c.level_bytes}});
    out["chunks"] = std::move(chunks);
    res.content_type = "application/json";
    res.text = out.dump() + "\n";
  }

  void StoreError(HttpReply& res, const Status& st, bool read) {
    if (st.code() == StatusCode::kNotFound) {
      if (read) metrics_.Miss();
      return Error(res, 404, "not found");
    }
    if (read) metrics_.Miss();
    if (st.code() == StatusCode::kInvalidArgument) return Error(res, 400, st.message());
    // The backend's own message names paths and hosts of this machine: it
    // goes to the operator's log, the client gets what happened.
    LogStoreError(st);
    if (st.code() == StatusCode::kIOError) {
      Error(res, 503, "store unavailable");
      res.headers.emplace_back("Retry-After", "1");
      return;
    }
    Error(res, 500, "store failed");
  }

  // At most one line every 10 s, with the count of the others.
  void LogStoreError(const Status& st) {
    std::lock_guard<std::mutex> lock(log_mu_);
    ++unlogged_errors_;
    const Clock::time_point now = Clock::now();
    if (logged_any_ && now - last_log_ < std::chrono::seconds(10)) return;
    std::fprintf(stderr, "cachegen serve: store error: %s (%llu since the last line)\n", st.ToString().c_str(),
                 static_cast<unsigned long long>(unlogged_errors_));
    unlogged_errors_ = 0;
    last_log_ = now;
    logged_any_ = true;
  }

  // Readiness: the store answers (a probe of a key nothing is stored under;
  // absent is an answer). /healthz says only that the process serves.
  void Ready(HttpReply& r) {
    const Result<uint64_t> probe = store_->Size(ChunkKey{}, 0);
    if (!probe.ok() && probe.status().code() != StatusCode::kNotFound) {
      LogStoreError(probe.status());
      Error(r, 503, "not ready: the store does not answer");
      r.headers.emplace_back("Retry-After", "1");
      return;
    }
    r.content_type = "text/plain";
    r.text = "ready\n";
  }

  ChunkStore* store_;
  ServiceOptions options_;
  Metrics metrics_;
  std::unique_ptr<HttpServer> server_;
  std::mutex log_mu_;  // guards the three below
  Clock::time_point last_log_{};
  bool logged_any_ = false;
  uint64_t unlogged_errors_ = 0;
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
