// The HTTP chunk service (include/cachegen/service.h, docs/SERVICE.md).
//
// Boost.Beast, like the client (http_store.cc). One thread accepts; a pool of
// `threads` workers serves one connection each, request after request, as
// long as it is kept alive. Each connection's reads and writes run on the
// worker's thread with their timeouts (BlockingStream), so a handler may
// block (a store's fsync, a shaped link's token bucket) without holding up
// other connections. A request body is read 64 KiB per receive at most,
// into a buffer sized from its Content-Length.
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cachegen/codec.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "service/blocking_stream.h"

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

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::vector_body<uint8_t>>;

// An answer: a text body, or frame bytes sent from their own buffer
// (through the shapers when `shaped`).
struct Reply {
  unsigned status = 200;
  std::string content_type;
  std::string text;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  bool shaped = false;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after it

  size_t body_size() const { return bytes ? bytes->size() : text.size(); }
};

// One connection being served.
struct Session {
  Session() { buffer.reserve(64 << 10); }  // Beast reads what the buffer holds, at most 64 KiB
  BlockingStream io;
  beast::flat_buffer buffer;
  std::unique_ptr<LinkShaper> shaper;   // ServiceOptions::connection_rate, from the first GET on
};

void Error(Reply& r, unsigned code, const std::string& message) {
  r.status = code;
  // After a malformed request the connection's byte stream cannot be trusted.
  if (code == 400 || code == 408 || code == 413) r.close = true;
  r.content_type = "application/json";
  r.text = nlohmann::json{{"error", message}}.dump() + "\n";
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
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
    beast::error_code ec;
    const auto endpoints = tcp::resolver(io_).resolve(options_.host, std::to_string(options_.port), ec);
    const std::string where = options_.host + ":" + std::to_string(options_.port);
    if (ec || endpoints.empty()) return Status::IOError("serve: cannot resolve " + where);
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) acceptor_.non_blocking(true, ec);
    if (ec) return Status::IOError("serve: cannot bind " + where + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    protocol_ = endpoint.protocol();
    const uint32_t threads = std::max<uint32_t>(options_.threads, 2);
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
    acceptor_thread_ = std::thread([this] { Accept(); });
    return Status::Ok();
  }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    {
      std::lock_guard<std::mutex> q(queue_mu_);
      stopping_ = true;
      for (Session* s : sessions_) s->io.Interrupt();
    }
    queue_cv_.notify_all();
    if (acceptor_thread_.joinable()) acceptor_thread_.join();
    for (std::thread& t : workers_) t.join();
    for (int fd : queue_) ::close(fd);
    queue_.clear();
    beast::error_code ignored;
    acceptor_.close(ignored);
    stopped_ = true;
    stop_cv_.notify_all();
  }

  void Wait() override {
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait(lock, [this] { return stopped_; });
  }

  std::string MetricsText() const override { return metrics_.Text(store_->stats()); }

 private:
  // Accepts connections for the workers; looks for Stop() every 50 ms.
  void Accept() {
    const int listen_fd = acceptor_.native_handle();
    for (;;) {
      {
        std::lock_guard<std::mutex> q(queue_mu_);
        if (stopping_) return;
      }
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      {
        std::lock_guard<std::mutex> q(queue_mu_);
        queue_.push_back(fd);
      }
      queue_cv_.notify_one();
    }
  }

  void Work() {
    for (;;) {
      int fd = -1;
      Session session;
      {
        std::unique_lock<std::mutex> q(queue_mu_);
        queue_cv_.wait(q, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        fd = queue_.front();
        queue_.pop_front();
        sessions_.insert(&session);
      }
      beast::error_code ec;
      session.io.socket().assign(protocol_, fd, ec);
      if (ec) {
        ::close(fd);
      } else {
        session.io.socket().set_option(tcp::no_delay(true), ec);
        Serve(session);
        session.io.socket().close(ec);
      }
      std::lock_guard<std::mutex> q(queue_mu_);
      sessions_.erase(&session);
    }
  }

  // Requests on one connection until it closes, fails, or stops being kept alive.
  void Serve(Session& s) {
    constexpr int kKeepAliveMs = 10000;  // a kept-alive connection idle this long is closed
    for (bool first = true;; first = false) {
      http::request_parser<http::vector_body<uint8_t>> parser;
      parser.body_limit(options_.max_body_bytes);
      Reply reply;
      beast::error_code ec = s.io.Run(first ? options_.read_timeout_ms : kKeepAliveMs, [&](auto done) {
        http::async_read_header(s.io.socket(), s.buffer, parser, done);
      });
      if (ec) {
        // Nothing of a request came: the peer closed, went idle or the
        // service stops. Else the request is malformed or stalled.
        if (!parser.got_some() || ec == net::error::operation_aborted) return;
        if (ec == http::error::body_limit) Error(reply, 413, "request body too large");
        else if (ec == beast::error::timeout) Error(reply, 408, "request header incomplete");
        else Error(reply, 400, "bad request: " + ec.message());
        Respond(s, nullptr, reply);
        return;
      }
      const Clock::time_point start = Clock::now();
      if (!ReadBody(s, parser, reply)) {
        if (reply.status != 200) Respond(s, nullptr, reply);
        return;
      }
      const Request& req = parser.get();
      try {
        Handle(req, reply, s);
      } catch (const std::exception&) {
        reply = Reply{};
        Error(reply, 500, "internal error");
      }
      metrics_.Request(std::string(req.method_string()), Route(PathOf(req)), reply.status,
                       req.body().size(), reply.body_size());
      if (!req.keep_alive()) reply.close = true;
      const bool sent = Respond(s, &req, reply);
      metrics_.Duration(std::chrono::duration<double>(Clock::now() - start).count());
      if (!sent || reply.close) return;
    }
  }

  // Reads the body of the request whose header `parser` holds, a receive at
  // a time, each within the read timeout. False when it did not all come:
  // `reply` is then the error to send (status 200: none, the connection is
  // gone).
  bool ReadBody(Session& s, http::request_parser<http::vector_body<uint8_t>>& parser, Reply& reply) {
    if (parser.is_done()) return true;
    // A client that waits for "100 Continue" before its body (curl does for
    // large ones) is told to go on.
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> go{http::status::continue_, 11};
      if (s.io.Run(options_.write_timeout_ms, [&](auto done) { http::async_write(s.io.socket(), go, done); }))
        return false;
    }
    while (!parser.is_done()) {
      const beast::error_code ec = s.io.Run(options_.read_timeout_ms, [&](auto done) {
        http::async_read_some(s.io.socket(), s.buffer, parser, done);
      });
      if (ec == net::error::operation_aborted) return false;
      if (ec == http::error::body_limit) Error(reply, 413, "request body too large");
      else if (ec) Error(reply, 400, "request body incomplete: " + ec.message());
      if (ec) return false;
    }
    return true;
  }

  // Sends `reply` (to `req`, null when it could not be read); false if the
  // connection failed. Whole, header and body in one gathered write; shaped,
  // the header first and the body 64 KiB at a time through the shapers.
  bool Respond(Session& s, const Request* req, const Reply& reply) {
    const uint8_t* body = reply.bytes ? reply.bytes->data() : reinterpret_cast<const uint8_t*>(reply.text.data());
    const size_t size = req && req->method() == http::verb::head ? 0 : reply.body_size();
    http::response<http::span_body<const uint8_t>> res{static_cast<http::status>(reply.status), 11};
    if (!reply.content_type.empty()) res.set(http::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) res.set(name, value);
    res.content_length(reply.body_size());
    res.keep_alive(!reply.close);
    http::response_serializer<http::span_body<const uint8_t>> sr{res};
    const bool shaped = reply.shaped && size > 0;
    if (!shaped) res.body() = {body, size};
    beast::error_code ec = s.io.Run(options_.write_timeout_ms, [&](auto done) {
      if (shaped) http::async_write_header(s.io.socket(), sr, done);
      else http::async_write(s.io.socket(), sr, done);
    });
    constexpr size_t kPiece = 64 << 10;
    for (size_t at = 0; shaped && !ec && at < size; at += kPiece) {
      const size_t n = std::min(kPiece, size - at);
      if (s.shaper) s.shaper->Acquire(n);
      if (options_.link) options_.link->Acquire(n);
      ec = s.io.Run(options_.write_timeout_ms,
                    [&](auto done) { net::async_write(s.io.socket(), net::buffer(body + at, n), done); });
    }
    if (ec) return false;
    if (reply.close) s.io.socket().shutdown(tcp::socket::shutdown_send, ec);
    return true;
  }

  // The request's path, without its query.
  static std::string PathOf(const Request& req) {
    const std::string_view target(req.target().data(), req.target().size());
    return std::string(target.substr(0, target.find('?')));
  }

  void Handle(const Request& req, Reply& r, Session& s) {
    const std::string path_text = PathOf(req);
    const std::string_view path = path_text;
    const http::verb m = req.method();
    constexpr std::string_view kChunks = "/v1/chunks/";
    if (path.substr(0, kChunks.size()) == kChunks) {
      const std::string_view rest = path.substr(kChunks.size());
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos || rest.find('/', slash + 1) != std::string_view::npos)
        return Error(r, 404, "no such endpoint");
      const std::string_view key = rest.substr(0, slash), level = rest.substr(slash + 1);
      if (m == http::verb::get || m == http::verb::head) return GetChunk(req, r, s, key, level);
      if (m == http::verb::put) return PutChunk(req, r, key, level);
      if (m == http::verb::delete_) return DeleteChunk(req, r, key, level);
      return NotAllowed(r, "GET, HEAD, PUT, DELETE");
    }
    if (path == "/v1/lookup") return m == http::verb::post ? Lookup(req, r) : NotAllowed(r, "POST");
    if (path == "/healthz" || path == "/metrics") {
      if (m != http::verb::get && m != http::verb::head) return NotAllowed(r, "GET, HEAD");
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

  static void NotAllowed(Reply& r, const char* allow) {
    Error(r, 405, "method not allowed");
    r.headers.emplace_back("Allow", allow);
  }

  bool Authorized(const Request& req, Reply& r, bool write) {
    if (options_.token.empty() || (!write && !options_.auth_reads)) return true;
    const std::string_view h(req[http::field::authorization].data(), req[http::field::authorization].size());
    constexpr std::string_view kBearer = "Bearer ";
    if (h.size() > kBearer.size() && h.substr(0, kBearer.size()) == kBearer &&
        ConstantTimeEqual(h.substr(kBearer.size()), options_.token))
      return true;
    Error(r, 401, h.empty() ? "missing bearer token" : "bad bearer token");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return false;
  }

  // Parses {key}/{level} of a chunk path; 400 on failure.
  static bool ParseChunkPath(std::string_view key_text, std::string_view level_text, Reply& r, ChunkKey* key,
                             uint32_t* level) {
    Result<ChunkKey> k = ChunkKey::FromHex(std::string(key_text));
    if (!k.ok()) {
      Error(r, 400, "bad chunk key (want 32 hex digits)");
      return false;
    }
    unsigned v = 0;
    const char* end = level_text.data() + level_text.size();
    auto [p, ec] = std::from_chars(level_text.data(), end, v);
    if (level_text.empty() || ec != std::errc() || p != end || v >= kMaxChunkLevels) {
      Error(r, 400, "bad level (want 0.." + std::to_string(kMaxChunkLevels - 1) + ")");
      return false;
    }
    *key = *k;
    *level = v;
    return true;
  }

  void GetChunk(const Request& req, Reply& r, Session& s, std::string_view key_text, std::string_view level_text) {
    if (!Authorized(req, r, false)) return;
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
    r.shaped = !options_.connection_rate.empty() || options_.link;
    if (!options_.connection_rate.empty() && !s.shaper) s.shaper = std::make_unique<LinkShaper>(options_.connection_rate);
  }

  void PutChunk(const Request& req, Reply& r, std::string_view key_text, std::string_view level_text) {
    if (!Authorized(req, r, true)) return;
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(key_text, level_text, r, &key, &level)) return;
    const std::span<const uint8_t> body(req.body().data(), req.body().size());
    Result<FrameInfo> info = InspectFrame(body);
    if (!info.ok()) return Error(r, 400, "body is not a valid frame: " + info.status().message());
    if (info->level != level)
      return Error(r, 400, "frame is level " + std::to_string(info->level) + ", path says " + std::to_string(level));
    if (info->bytes != body.size()) return Error(r, 400, "body has bytes after the frame");
    Status st = store_->Put(key, level, body);
    if (!st.ok()) return StoreError(r, st, false);
    r.status = 201;
  }

  void DeleteChunk(const Request& req, Reply& r, std::string_view key_text, std::string_view level_text) {
    if (!Authorized(req, r, true)) return;
    ChunkKey key;
    uint32_t level = 0;
    if (!ParseChunkPath(key_text, level_text, r, &key, &level)) return;
    Status st = store_->Delete(key, level);
    if (!st.ok()) return StoreError(r, st, false);
    r.status = 204;
  }

  void Lookup(const Request& req, Reply& res) {
    if (!Authorized(req, res, false)) return;
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
    const std::vector<CachedChunk> found = LookupPrefix(*store_, keys, levels);
    nlohmann::json out;
    out["cached"] = found.size();
    out["requested"] = keys.size();
    nlohmann::json chunks = nlohmann::json::array();
    for (const CachedChunk& c : found) chunks.push_back({{"key", c.key.Hex()}, {"sizes", c.level_bytes}});
    out["chunks"] = std::move(chunks);
    res.content_type = "application/json";
    res.text = out.dump() + "\n";
  }

  void StoreError(Reply& res, const Status& st, bool read) {
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
  Metrics metrics_;
  net::io_context io_;  // the acceptor's; never run (Accept polls its socket)
  tcp::acceptor acceptor_{io_};
  tcp protocol_ = tcp::v4();
  int port_ = 0;
  std::thread acceptor_thread_;
  std::vector<std::thread> workers_;
  std::mutex queue_mu_;  // guards the three below
  std::condition_variable queue_cv_;
  std::deque<int> queue_;         // accepted connections no worker took yet
  std::set<Session*> sessions_;   // connections being served
  bool stopping_ = false;
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
