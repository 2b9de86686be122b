// ChunkStore over the HTTP chunk service (ConnectService in include/cachegen/service.h).
//
// Boost.Beast, like the service (server.cc), not Debian's cpp-httplib: that
// is a compiled library that reads a body 4 KiB per receive, with a poll
// before each, and at 10 Gbit/s those calls took about a third of a
// transfer's CPU; Beast reads 64 KiB per receive here.
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <charconv>
#include <chrono>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>

#include "cachegen/codec.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "service/blocking_stream.h"

namespace cachegen {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Response = http::response<http::vector_body<uint8_t>>;

// One keep-alive connection (BlockingStream: every operation has its timeout).
class Connection {
 public:
  Connection() { buffer_.reserve(kReadBytes); }  // Beast reads what the buffer holds, at most 64 KiB

  // Resolves host (not bounded by the timeout) and connects.
  beast::error_code Connect(const std::string& host, int port, int timeout_ms) {
    const beast::error_code ec = s_.Connect(host, port, timeout_ms);
    beast::error_code ignored;  // requests are small and answered at once: send them without delay
    if (!ec) s_.socket().set_option(tcp::no_delay(true), ignored);
    return ec;
  }
  template <typename Request>
  beast::error_code Write(Request& req, int timeout_ms) {
    return s_.Run(timeout_ms, [&](auto done) { http::async_write(s_.socket(), req, done); });
  }
  // Reads what one receive brings into the parser (the whole timeout is for
  // this one receive: a server silent that long has stalled).
  template <typename Parser>
  beast::error_code ReadSome(Parser& parser, int timeout_ms) {
    return s_.Run(timeout_ms, [&](auto done) { http::async_read_some(s_.socket(), buffer_, parser, done); });
  }

 private:
  static constexpr size_t kReadBytes = 64 << 10;
  BlockingStream s_;
  beast::flat_buffer buffer_;
};

// ClientOptions::request_timeout_ms of one try, from sending on: bounds each
// operation's own timeout by the time left.
class RequestClock {
 public:
  explicit RequestClock(int timeout_ms)
      : bounded_(timeout_ms > 0), until_(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms)) {}
  // The timeout for the next operation: its own, or the time left when less
  // (at least 1 ms: an operation with no time at all still has to fail).
  int Bound(int op_timeout_ms) {
    if (!bounded_) return op_timeout_ms;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until_ - std::chrono::steady_clock::now()).count();
    capped_ = left < op_timeout_ms;
    return capped_ ? static_cast<int>(std::max<int64_t>(left, 1)) : op_timeout_ms;
  }
  // Whether `error` of the last operation is this bound running out.
  bool Expired(const beast::error_code& error) const { return capped_ && error == beast::error::timeout; }

 private:
  bool bounded_;
  bool capped_ = false;
  std::chrono::steady_clock::time_point until_;
};

// What one request came back with: an answer, or a transport failure.
struct Exchange {
  beast::error_code error;  // set when no whole answer came
  bool connect_failed = false;  // no connection: sending again on a new one would fail the same way
  bool abandoned = false;       // the caller's progress said stop
  bool oversized = false;       // the answer was over ClientOptions::max_frame_bytes
  bool expired = false;         // ClientOptions::request_timeout_ms ran out
  Response answer;
};

class HttpStore final : public ChunkStore {
 public:
  HttpStore(std::string url, std::string host, int port, ClientOptions options)
      : url_(std::move(url)), host_(std::move(host)), port_(port), options_(std::move(options)) {}

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    Exchange x = Send(http::verb::put, Path(key, level), frame, "application/octet-stream");
    if (x.error) return NetError(x);
    const int status = x.answer.result_int();
    if (status != 201 && status != 200 && status != 204) return HttpError(x.answer);
    puts_++;
    bytes_written_ += frame.size();
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    return GetWithProgress(key, level, nullptr);
  }

  Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level,
                                               const Progress& progress) override {
    Exchange x = Send(http::verb::get, Path(key, level), {}, nullptr, progress);
    if (x.error) {
      if (x.abandoned) return Status::IOError("service " + url_ + ": cancelled");
      misses_++;
      if (x.oversized)
        return Status::IOError("service " + url_ + ": chunk " + key.Hex() + "/" + std::to_string(level) +
                               " is larger than the client's limit of " + std::to_string(options_.max_frame_bytes) +
                               " bytes");
      return NetError(x);
    }
    if (x.answer.result_int() != 200) {
      misses_++;
      return HttpError(x.answer);
    }
    std::vector<uint8_t> bytes = std::move(x.answer.body());
    Result<FrameInfo> info = VerifyFrame(bytes);
    if (!info.ok() || info->level != level || info->bytes != bytes.size()) {
      misses_++;
      corrupt_++;
      return Status::NotFound("chunk " + key.Hex() + "/" + std::to_string(level) + " from " + url_ +
                              " failed verification");
    }
    hits_++;
    bytes_read_ += bytes.size();
    return bytes;
  }

  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    Exchange x = Send(http::verb::head, Path(key, level), {}, nullptr);
    if (x.error) return NetError(x);
    if (x.answer.result_int() != 200) return HttpError(x.answer);
    const std::optional<uint64_t> n = HeaderNumber(x.answer, "X-Chunk-Bytes");
    if (!n) return Status::IOError("service " + url_ + ": HEAD without X-Chunk-Bytes");
    return *n;
  }

  Status Delete(const ChunkKey& key, uint32_t level) override {
    Exchange x = Send(http::verb::delete_, Path(key, level), {}, nullptr);
    if (x.error) return NetError(x);
    const int status = x.answer.result_int();
    if (status != 204 && status != 200 && status != 404) return HttpError(x.answer);
    return Status::Ok();
  }

  StoreStats stats() const override {
    StoreStats s;
    s.puts = puts_;
    s.hits = hits_;
    s.misses = misses_;
    s.corrupt = corrupt_;
    s.bytes_written = bytes_written_;
    s.bytes_read = bytes_read_;
    return s;
  }

  std::string uri() const override { return url_; }

  Result<PrefixSizes> SizesOfPrefix(std::span<const ChunkKey> keys, uint32_t levels) override {
    nlohmann::json req;
    nlohmann::json hex = nlohmann::json::array();
    for (const ChunkKey& k : keys) hex.push_back(k.Hex());
    req["keys"] = std::move(hex);
    req["levels"] = levels;
    const std::string body = req.dump();
    Exchange x = Send(http::verb::post, "/v1/lookup",
                      {reinterpret_cast<const uint8_t*>(body.data()), body.size()}, "application/json");
    if (x.error) return NetError(x);
    if (x.answer.result_int() != 200) return HttpError(x.answer);
    nlohmann::json out = nlohmann::json::parse(x.answer.body(), nullptr, false);
    if (out.is_discarded() || !out.is_object() || !out.contains("chunks") || !out["chunks"].is_array())
      return Status::IOError("service " + url_ + ": malformed lookup answer");
    PrefixSizes answer;
    std::vector<std::vector<uint64_t>>& found = answer.level_bytes;
    for (const auto& c : out["chunks"]) {
      if (found.size() >= keys.size() || !c.is_object() || !c.contains("key") || !c["key"].is_string() ||
          !c.contains("sizes") || !c["sizes"].is_array() || c["sizes"].size() > kMaxChunkLevels)
        return Status::IOError("service " + url_ + ": malformed lookup answer");
      Result<ChunkKey> key = ChunkKey::FromHex(c["key"].get<std::string>());
      if (!key.ok() || *key != keys[found.size()])
        return Status::IOError("service " + url_ + ": lookup answered other keys");
      std::vector<uint64_t> sizes;
      for (const auto& s : c["sizes"]) {
        if (!s.is_number_unsigned()) return Status::IOError("service " + url_ + ": malformed lookup answer");
        sizes.push_back(s.get<uint64_t>());
      }
      found.push_back(std::move(sizes));
    }
    if (out.contains("error")) {
      if (!out["error"].is_string()) return Status::IOError("service " + url_ + ": malformed lookup answer");
      answer.store_error = Status::IOError("service " + url_ + ": its store: " + out["error"].get<std::string>());
    }
    return answer;
  }

 private:
  static std::string Path(const ChunkKey& key, uint32_t level) {
    return "/v1/chunks/" + key.Hex() + "/" + std::to_string(level);
  }

  // Sends one request on a pooled connection and reads its answer. Every
  // request of this API is idempotent (PUT stores the same bytes again,
  // lookup only reads), so one that failed in transport with no answer (a
  // kept-alive connection the server had closed, a connection lost while the
  // server's accept queue was full) is sent once more on a new connection;
  // one that found no connection, or that the caller or the size limit
  // ended, is not.
  Exchange Send(http::verb verb, const std::string& target, std::span<const uint8_t> body, const char* content_type,
                const Progress& progress = {}) {
    std::unique_ptr<Connection> c = Take();
    Exchange x = Attempt(c, verb, target, body, content_type, progress);
    if (x.error && !x.connect_failed && !x.abandoned && !x.oversized && !x.expired) {
      c.reset();
      x = Attempt(c, verb, target, body, content_type, progress);
    }
    if (!x.error && x.answer.keep_alive()) Give(std::move(c));
    return x;
  }

  // One try on `c` (connected first when null).
  Exchange Attempt(std::unique_ptr<Connection>& c, http::verb verb, const std::string& target,
                   std::span<const uint8_t> body, const char* content_type, const Progress& progress) {
    Exchange x;
    if (!c) {
      c = std::make_unique<Connection>();
      x.error = c->Connect(host_, port_, options_.connect_timeout_ms);
      if (x.error) {
        x.connect_failed = true;
        return x;
      }
    }
    http::request<http::span_body<const uint8_t>> req{verb, target, 11};
    req.set(http::field::host, host_);
    if (!options_.token.empty()) req.set(http::field::authorization, "Bearer " + options_.token);
    if (content_type) req.set(http::field::content_type, content_type);
    req.body() = {body.data(), body.size()};
    req.prepare_payload();
    RequestClock clock(options_.request_timeout_ms);
    x.error = c->Write(req, clock.Bound(options_.write_timeout_ms));
    if (x.error) {
      x.expired = clock.Expired(x.error);
      return x;
    }

    http::response_parser<http::vector_body<uint8_t>> parser;
    parser.body_limit(options_.max_frame_bytes);
    parser.skip(verb == http::verb::head);  // a HEAD answer's Content-Length has no body behind it
    do {
      x.error = c->ReadSome(parser, clock.Bound(options_.read_timeout_ms));
      x.oversized = x.error == http::error::body_limit || x.error == http::error::buffer_overflow;
      x.expired = clock.Expired(x.error);
      if (x.error) return x;
      const bool frame_arriving = parser.is_header_done() && parser.get().result_int() == 200;
      if (frame_arriving && progress && !progress(parser.get().body().size())) {
        x.abandoned = true;
        x.error = net::error::operation_aborted;
        return x;
      }
    } while (!parser.is_done());
    x.answer = parser.release();
    return x;
  }

  // A keep-alive connection from the pool, or none (Attempt makes one).
  std::unique_ptr<Connection> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.empty()) return nullptr;
    auto c = std::move(pool_.back());
    pool_.pop_back();
    return c;
  }
  void Give(std::unique_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.size() < 64) pool_.push_back(std::move(c));
  }

  Status NetError(const Exchange& x) const {
    if (x.expired)
      return Status::IOError("service " + url_ + ": no whole answer within the request timeout (" +
                             std::to_string(options_.request_timeout_ms) + " ms)");
    return Status::IOError("service " + url_ + ": " + x.error.message());
  }
  Status HttpError(const Response& r) const {
    const int status = r.result_int();
    std::string msg = "service " + url_ + ": HTTP " + std::to_string(status);
    nlohmann::json body = nlohmann::json::parse(r.body(), nullptr, false);
    if (body.is_object() && body.contains("error") && body["error"].is_string())
      msg += ": " + body["error"].get<std::string>();
    if (status == 404) return Status::NotFound(msg);
    if (status >= 400 && status < 500) return Status::InvalidArgument(msg);
    return Status::IOError(msg);
  }
  // A header holding an unsigned number; nullopt when absent or malformed.
  static std::optional<uint64_t> HeaderNumber(const Response& r, const char* name) {
    const beast::string_view v = r[name];
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
    return n;
  }

  std::string url_, host_;
  int port_;
  ClientOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> pool_;
  std::atomic<uint64_t> puts_{0}, hits_{0}, misses_{0}, corrupt_{0}, bytes_written_{0}, bytes_read_{0};
};

}  // namespace

Result<std::unique_ptr<ChunkStore>> ConnectService(const std::string& url, const ClientOptions& options) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    return Status::InvalidArgument("service URL '" + url + "' must start with http://");
  std::string rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || rest.find('/') != std::string::npos)
    return Status::InvalidArgument("service URL '" + url + "' must be http://HOST:PORT");
  const std::string host = rest.substr(0, colon), port_text = rest.substr(colon + 1);
  int port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || p != port_text.data() + port_text.size() || port <= 0 || port > 65535)
    return Status::InvalidArgument("service URL '" + url + "': bad port");
  // A timeout of 0 would end every connect, receive or send at once.
  if (options.connect_timeout_ms <= 0 || options.read_timeout_ms <= 0 || options.write_timeout_ms <= 0)
    return Status::InvalidArgument("service client: connect, read and write timeouts must be > 0 ms");
  if (options.request_timeout_ms < 0)
    return Status::InvalidArgument("service client: request timeout must be >= 0 ms (0 = unbounded)");
  return std::unique_ptr<ChunkStore>(std::make_unique<HttpStore>("http://" + rest, host, port, options));
}

}  // namespace cachegen
