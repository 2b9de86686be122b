// HttpServer (http_server.h).
#include "service/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "service/blocking_stream.h"

namespace cachegen {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// One connection being served.
struct Session {
  Session() { buffer.reserve(64 << 10); }  // Beast reads what the buffer holds, at most 64 KiB
  BlockingStream io;
  beast::flat_buffer buffer;
  std::unique_ptr<LinkShaper> shaper;  // HttpServerOptions::connection_rate, from the first shaped reply on
};

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandlers handlers;
  net::io_context io;  // the acceptor's; never run (Accept polls its socket)
  tcp::acceptor acceptor{io};
  tcp protocol = tcp::v4();
  int port = 0;
  std::thread acceptor_thread;
  std::vector<std::thread> workers;
  std::mutex mu;  // guards the four below
  std::condition_variable cv;
  std::deque<int> queue;        // accepted connections no worker took yet
  std::set<Session*> sessions;  // connections being served
  bool stopping = false;
  bool stopped = false;

  Status Bind() {
    beast::error_code ec;
    const auto endpoints = tcp::resolver(io).resolve(options.host, std::to_string(options.port), ec);
    const std::string where = options.host + ":" + std::to_string(options.port);
    if (ec || endpoints.empty()) return Status::IOError("cannot resolve " + where);
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) acceptor.non_blocking(true, ec);
    if (ec) return Status::IOError("cannot listen on " + where + ": " + ec.message());
    port = acceptor.local_endpoint().port();
    protocol = endpoint.protocol();
    const uint32_t threads = std::max<uint32_t>(options.threads, 2);
    for (uint32_t i = 0; i < threads; ++i) workers.emplace_back([this] { Work(); });
    acceptor_thread = std::thread([this] { Accept(); });
    return Status::Ok();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      stopping = true;
      for (Session* s : sessions) s->io.Interrupt();
    }
    cv.notify_all();
    if (acceptor_thread.joinable()) acceptor_thread.join();
    for (std::thread& t : workers) t.join();
    for (int fd : queue) ::close(fd);
    queue.clear();
    beast::error_code ignored;
    acceptor.close(ignored);
  }

  // Accepts connections for the workers; looks for Stop() every 50 ms.
  void Accept() {
    const int listen_fd = acceptor.native_handle();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) return;
      }
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(fd);
      }
      cv.notify_one();
    }
  }

  void Work() {
    for (;;) {
      int fd = -1;
      Session session;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [this] { return stopping || !queue.empty(); });
        if (stopping) return;
        fd = queue.front();
        queue.pop_front();
        sessions.insert(&session);
      }
      beast::error_code ec;
      session.io.socket().assign(protocol, fd, ec);
      if (ec) {
        ::close(fd);
      } else {
        session.io.socket().set_option(tcp::no_delay(true), ec);
        Serve(session);
        session.io.socket().close(ec);
      }
      std::lock_guard<std::mutex> lock(mu);
      sessions.erase(&session);
    }
  }

  // Requests on one connection until it closes, fails, or stops being kept alive.
  void Serve(Session& s) {
    for (bool first = true;; first = false) {
      http::request_parser<http::vector_body<uint8_t>> parser;
      parser.body_limit(options.max_body_bytes);
      HttpReply reply;
      beast::error_code ec = s.io.Run(first ? options.read_timeout_ms : options.keep_alive_ms, [&](auto done) {
        http::async_read_header(s.io.socket(), s.buffer, parser, done);
      });
      if (ec) {
        // Nothing of a request came: the peer closed, went idle or the
        // server stops. Else the request is malformed or stalled.
        if (!parser.got_some() || ec == net::error::operation_aborted) return;
        if (ec == http::error::body_limit) Refuse(reply, 413, "request body too large");
        else if (ec == beast::error::timeout) Refuse(reply, 408, "request header incomplete");
        else Refuse(reply, 400, "bad request: " + ec.message());
        Respond(s, nullptr, reply);
        return;
      }
      const Clock::time_point start = Clock::now();
      if (!ReadBody(s, parser, reply)) {
        if (reply.status != 200) Respond(s, nullptr, reply);
        return;
      }
      const HttpRequest& req = parser.get();
      try {
        handlers.handle(req, reply);
      } catch (const std::exception&) {
        reply = HttpReply{};
        Refuse(reply, 500, "internal error");
      }
      if (!req.keep_alive()) reply.close = true;
      if (handlers.answered) handlers.answered(req, reply);
      const bool sent = Respond(s, &req, reply);
      if (handlers.done) handlers.done(std::chrono::duration<double>(Clock::now() - start).count());
      if (!sent || reply.close) return;
    }
  }

  void Refuse(HttpReply& reply, unsigned status, const std::string& message) {
    handlers.error(reply, status, message);
    reply.status = status;
    // After a malformed request the connection's byte stream cannot be trusted.
    if (status == 400 || status == 408 || status == 413) reply.close = true;
  }

  // Reads the body of the request whose header `parser` holds, a receive at
  // a time, each within the read timeout. False when it did not all come:
  // `reply` is then the error to send (status 200: none, the connection is
  // gone).
  bool ReadBody(Session& s, http::request_parser<http::vector_body<uint8_t>>& parser, HttpReply& reply) {
    if (parser.is_done()) return true;
    // A client that waits for "100 Continue" before its body (curl does for
    // large ones) is told to go on.
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> go{http::status::continue_, 11};
      if (s.io.Run(options.write_timeout_ms, [&](auto done) { http::async_write(s.io.socket(), go, done); }))
        return false;
    }
    while (!parser.is_done()) {
      const beast::error_code ec = s.io.Run(options.read_timeout_ms, [&](auto done) {
        http::async_read_some(s.io.socket(), s.buffer, parser, done);
      });
      if (ec == net::error::operation_aborted) return false;
      if (ec == http::error::body_limit) Refuse(reply, 413, "request body too large");
      else if (ec) Refuse(reply, 400, "request body incomplete: " + ec.message());
      if (ec) return false;
    }
    return true;
  }

  // Sends `reply` (to `req`, null when it could not be read); false if the
  // connection failed. Whole, header and body go in one gathered write;
  // shaped, the header first and the body 64 KiB at a time through the
  // token buckets; streamed, a chunk per piece.
  bool Respond(Session& s, const HttpRequest* req, const HttpReply& reply) {
    const bool head = req && req->method() == http::verb::head;
    const uint8_t* body = reply.bytes ? reply.bytes->data() : reinterpret_cast<const uint8_t*>(reply.text.data());
    const size_t size = head ? 0 : reply.body_size();
    http::response<http::span_body<const uint8_t>> res{static_cast<http::status>(reply.status), 11};
    if (!reply.content_type.empty()) res.set(http::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) res.set(name, value);
    const bool streamed = reply.stream && !head;
    if (streamed) res.chunked(true);
    else res.content_length(reply.body_size());
    res.keep_alive(!reply.close);
    http::response_serializer<http::span_body<const uint8_t>> sr{res};
    const bool whole = !streamed && !(reply.shaped && size > 0);
    if (whole) res.body() = {body, size};
    beast::error_code ec = s.io.Run(options.write_timeout_ms, [&](auto done) {
      if (whole) http::async_write(s.io.socket(), sr, done);
      else http::async_write_header(s.io.socket(), sr, done);
    });
    if (!ec && streamed) ec = Stream(s, reply);
    constexpr size_t kPiece = 64 << 10;
    for (size_t at = 0; !whole && !streamed && !ec && at < size; at += kPiece) {
      const size_t n = std::min(kPiece, size - at);
      if (!options.connection_rate.empty() && !s.shaper) s.shaper = std::make_unique<LinkShaper>(options.connection_rate);
      if (s.shaper) s.shaper->Acquire(n);
      if (options.link) options.link->Acquire(n);
      ec = Write(s, net::buffer(body + at, n));
    }
    if (ec) return false;
    if (reply.close) s.io.socket().shutdown(tcp::socket::shutdown_send, ec);
    return true;
  }

  // The body of a streamed reply, a chunk per piece, then the last chunk.
  beast::error_code Stream(Session& s, const HttpReply& reply) {
    beast::error_code ec;
    reply.stream([&](std::string_view piece) {
      if (!ec && !piece.empty()) ec = Write(s, http::make_chunk(net::buffer(piece.data(), piece.size())));
      return !ec;
    });
    if (!ec) ec = Write(s, http::make_chunk_last());
    return ec;
  }

  template <typename Buffers>
  beast::error_code Write(Session& s, const Buffers& buffers) {
    return s.io.Run(options.write_timeout_ms, [&](auto done) { net::async_write(s.io.socket(), buffers, done); });
  }
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, HttpHandlers handlers) {
  if (!handlers.handle || !handlers.error) return Status::InvalidArgument("http server: no handler");
  if (options.read_timeout_ms <= 0 || options.write_timeout_ms <= 0 || options.keep_alive_ms <= 0)
    return Status::InvalidArgument("http server: timeouts must be > 0 ms");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handlers = std::move(handlers);
  CG_RETURN_IF_ERROR(impl->Bind());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
int HttpServer::port() const { return impl_->port; }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace cachegen
