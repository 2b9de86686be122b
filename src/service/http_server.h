// The HTTP/1.1 server under the chunk service (server.cc) and the
// completion server (src/serve): Boost.Beast, one thread accepting, a pool
// of workers each serving one connection at a time, request after request,
// as long as it is kept alive. A handler runs on its worker's thread and may
// block (a store's fsync, a shaped link, a generation) without holding up
// other connections. Every receive and every write has its timeout
// (BlockingStream).
#ifndef CACHEGEN_SERVICE_HTTP_SERVER_H_
#define CACHEGEN_SERVICE_HTTP_SERVER_H_

#include <boost/beast/http.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cachegen/service.h"
#include "cachegen/status.h"

namespace cachegen {

using HttpRequest = boost::beast::http::request<boost::beast::http::vector_body<uint8_t>>;

// The request's path, without its query.
inline std::string_view HttpPath(const HttpRequest& req) {
  const std::string_view target(req.target().data(), req.target().size());
  return target.substr(0, target.find('?'));
}

// A handler's answer: a text body, bytes sent from their own buffer, or a
// stream of pieces (chunked transfer encoding).
struct HttpReply {
  unsigned status = 200;
  std::string content_type;
  std::string text;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  // Bytes through HttpServerOptions' token buckets, 64 KiB at a time.
  bool shaped = false;
  // Set: the body is what stream(write) writes, a piece per call of write,
  // which returns false once the connection failed (stop then).
  std::function<void(const std::function<bool(std::string_view)>& write)> stream;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after it

  size_t body_size() const { return bytes ? bytes->size() : text.size(); }
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;              // 0: any free port
  uint32_t threads = 64;     // connections served at once (at least 2)
  uint64_t max_body_bytes = 64ull << 20;  // larger request bodies get 413
  int read_timeout_ms = 5000;   // per receive; a request header must all come within it
  int write_timeout_ms = 5000;  // per write
  int keep_alive_ms = 10000;    // an idle kept-alive connection is closed after it
  // Shaped replies (HttpReply::shaped): per connection, through a token
  // bucket following this trace (timed from its first shaped reply); and
  // through `link`, shared by every connection. Empty / null: unlimited.
  std::vector<RateStep> connection_rate;
  std::shared_ptr<LinkShaper> link;
};

struct HttpHandlers {
  // Answers a request (exceptions become 500).
  std::function<void(const HttpRequest&, HttpReply&)> handle;
  // Fills the answer to a request the server refused itself: 400 malformed
  // or incomplete, 408 header not within the read timeout, 413 body over
  // the limit, 500 a handler threw.
  std::function<void(HttpReply&, unsigned status, const std::string& message)> error;
  // Optional: a handled request's answer just before it is sent, and the
  // time from its header to its last byte sent.
  std::function<void(const HttpRequest&, const HttpReply&)> answered;
  std::function<void(double seconds)> done;
};

class HttpServer {
 public:
  // Binds and starts serving; kIOError when the address cannot be bound,
  // kInvalidArgument for a timeout <= 0.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, HttpHandlers handlers);
  ~HttpServer();  // Stop()
  int port() const;
  // Stops accepting, ends every connection's I/O under way, and waits for
  // the workers (a handler running finishes first). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cachegen

#endif  // CACHEGEN_SERVICE_HTTP_SERVER_H_
