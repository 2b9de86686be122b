// The HTTP/1.1 server under the chunk service (server.cc) and the
// completion server (src/serve): Boost.Beast. One reactor thread accepts
// connections and reads every request, header and body, asynchronously: a
// connection that is idle, slow or still sending holds no worker. A request
// read whole goes to a pool of workers; its handler runs on a worker's thread
// and may block (a store's fsync, a shaped link, a generation), and the
// worker writes the answer (BlockingStream: every write has its timeout),
// then hands a kept-alive connection back to the reactor for its next
// request. Before a body is read, the header is checked (HTTP strictness,
// HttpHandlers::admit: authentication) and the body's bytes are reserved
// from a budget shared by all connections, so refused or oversized
// requests never make the server buffer their bodies.
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
  // Set by the server before the handler runs: true once the client has
  // closed its connection (or shut down its sending side), so a long
  // handler (a generation) can stop for a client that has gone.
  std::function<bool()> peer_gone;

  size_t body_size() const { return bytes ? bytes->size() : text.size(); }
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;              // 0: any free port
  uint32_t threads = 64;     // handlers run at once (at least 2); open connections are not bounded by it
  uint64_t max_body_bytes = 64ull << 20;  // larger request bodies get 413
  // Bytes of request bodies being received or handled at once, all
  // connections together (at least max_body_bytes): a request whose body
  // does not fit now gets 503 with Retry-After.
  uint64_t max_inflight_body_bytes = 256ull << 20;
  uint32_t max_connections = 4096;         // open at once; more are closed as they are accepted
  uint32_t max_connections_per_ip = 256;   // open at once from one client address
  // A request's whole header must come within it (not restarted per byte);
  // each receive of a body too.
  int read_timeout_ms = 5000;
  int write_timeout_ms = 5000;  // per write
  int keep_alive_ms = 10000;    // a kept-alive connection's next request header must come within it
  // Stop lets running handlers finish and their answers go out for this
  // long (a shutdown's 503s), then cuts off what is still being written.
  int stop_grace_ms = 2000;
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
  // or incomplete (and headers HTTP/1.1 forbids: a Transfer-Encoding other
  // than chunked, or with Content-Length; a repeated Authorization), 408
  // header not within the read timeout, 413 body over the limit, 503 bodies
  // in flight over their budget, 500 a handler threw.
  std::function<void(HttpReply&, unsigned status, const std::string& message)> error;
  // Optional: a request's header, before its body is read (the request's
  // body is empty here). False refuses it with `reply` (e.g. 401): the body
  // is never read and the connection is closed after the answer.
  std::function<bool(const HttpRequest& header, HttpReply& reply)> admit;
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
  // Stops accepting and reading requests, lets running handlers finish and
  // answer within stop_grace_ms, then ends every connection's I/O under way
  // and waits for the workers (a handler still running finishes first).
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cachegen

#endif  // CACHEGEN_SERVICE_HTTP_SERVER_H_
