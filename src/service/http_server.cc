// HttpServer (http_server.h).
#include "service/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
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
using Parser = http::request_parser<http::vector_body<uint8_t>>;

// One connection: owned by the reactor while a request is read, by a
// worker while it is handled and answered.
struct Conn {
  explicit Conn(net::io_context& io) : socket(io), timer(io) { buffer.reserve(64 << 10); }
  tcp::socket socket;     // the reactor's; its descriptor moves to a worker for the answer
  net::steady_timer timer;  // the deadline of the read under way
  bool timed_out = false;
  // Reactor thread only: a worker has the connection (a deadline that fired
  // just before it was cancelled must not touch the socket meanwhile).
  bool at_worker = false;
  beast::flat_buffer buffer;  // Beast reads what it holds, at most 64 KiB; pipelined bytes stay here
  std::optional<Parser> parser;
  std::string ip;
  bool first = true;  // no request read yet
  uint64_t reserved = 0;  // body bytes reserved from the budget
  std::unique_ptr<LinkShaper> shaper;  // HttpServerOptions::connection_rate, from the first shaped reply on
};
using ConnPtr = std::shared_ptr<Conn>;

// A worker's means of writing: the connection's descriptor, for the time
// of one answer.
struct Session {
  BlockingStream io;
};

// Whether a client has closed its connection, for handlers that poll it
// often (llama.cpp's abort callback runs between every pair of graph
// nodes): the socket is polled at most once a millisecond, and a close seen
// is kept. Callable from any thread.
class PeerWatch {
 public:
  explicit PeerWatch(int fd) : fd_(fd) {}
  bool Gone() {
    if (gone_.load(std::memory_order_relaxed)) return true;
    const int64_t now = Clock::now().time_since_epoch().count();
    int64_t next = next_poll_.load(std::memory_order_relaxed);
    if (now < next || !next_poll_.compare_exchange_strong(next, now + kPollEvery)) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) gone_ = true;
    return gone_.load();
  }

 private:
  static constexpr int64_t kPollEvery =
      std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(1)).count();
  const int fd_;
  std::atomic<int64_t> next_poll_{0};
  std::atomic<bool> gone_{false};
};

// Whether a request header breaks rules that a lenient parser lets
// through (RFC 9112 6.1, 6.3): a Transfer-Encoding that is not exactly
// "chunked" (as Beast reads it, the body would be framed by a
// Content-Length the sender did not mean), one next to a Content-Length,
// and a repeated Authorization (which one counts would be ambiguous).
std::optional<std::string> HeaderViolation(const HttpRequest& req) {
  const auto te = req.find(http::field::transfer_encoding);
  if (te != req.end()) {
    if (!beast::iequals(te->value(), "chunked")) return "Transfer-Encoding other than chunked";
    if (req.count(http::field::content_length) > 0) return "Transfer-Encoding with Content-Length";
    if (req.count(http::field::transfer_encoding) > 1) return "repeated Transfer-Encoding";
  }
  if (req.count(http::field::authorization) > 1) return "repeated Authorization";
  return std::nullopt;
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandlers handlers;
  net::io_context io;  // the reactor's
  tcp::acceptor acceptor{io};
  tcp protocol = tcp::v4();
  int port = 0;
  std::thread reactor;
  std::vector<std::thread> workers;
  // Reactor thread only:
  std::set<ConnPtr> conns;                 // open, in the reactor's hands or a worker's
  std::map<std::string, uint32_t> per_ip;  // open connections by client address
  // Shared:
  std::mutex mu;  // guards the four below
  std::condition_variable cv;
  std::condition_variable idle;  // a worker finished an answer (Stop's grace)
  std::deque<ConnPtr> queue;    // requests read whole, no worker took yet
  std::set<Session*> sessions;  // answers being written
  uint64_t inflight_body = 0;   // bytes reserved by requests being read or handled
  bool stopping = false;

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
    if (ec) return Status::IOError("cannot listen on " + where + ": " + ec.message());
    port = acceptor.local_endpoint().port();
    protocol = endpoint.protocol();
    options.max_inflight_body_bytes = std::max(options.max_inflight_body_bytes, options.max_body_bytes);
    const uint32_t threads = std::max<uint32_t>(options.threads, 2);
    for (uint32_t i = 0; i < threads; ++i) workers.emplace_back([this] { Work(); });
    Accept();
    reactor = std::thread([this] {
      auto guard = net::make_work_guard(io);
      io.run();
    });
    return Status::Ok();
  }

  // Workers first (a handler running finishes; an answer being written is
  // cut off), then the reactor closes the listener and every connection.
  void Stop() {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (stopping) return;
      stopping = true;
      cv.notify_all();
      idle.wait_for(lock, std::chrono::milliseconds(options.stop_grace_ms), [this] { return sessions.empty(); });
      for (Session* s : sessions) s->io.Interrupt();
    }
    for (std::thread& t : workers) t.join();
    net::post(io, [this] {
      beast::error_code ignored;
      acceptor.close(ignored);
      for (const ConnPtr& c : conns) {
        c->socket.close(ignored);
        c->timer.cancel();
      }
      conns.clear();
      per_ip.clear();
      io.stop();
    });
    if (reactor.joinable()) reactor.join();
    queue.clear();
  }

  // --- Reactor: accepting and reading requests -------------------------

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) Admit(std::move(socket));
      Accept();
    });
  }

  // A new connection, unless there are too many (from its address, or in all).
  void Admit(tcp::socket socket) {
    beast::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    if (ec) return;
    std::string ip = peer.address().to_string();
    if (conns.size() >= options.max_connections || per_ip[ip] >= options.max_connections_per_ip) {
      if (per_ip[ip] == 0) per_ip.erase(ip);
      socket.close(ec);
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto c = std::make_shared<Conn>(io);
    c->socket = std::move(socket);
    c->ip = std::move(ip);
    ++per_ip[c->ip];
    conns.insert(c);
    ReadHeader(c);
  }

  void Close(const ConnPtr& c) {
    beast::error_code ignored;
    c->socket.close(ignored);
    c->timer.cancel();
    Release(*c);
    if (conns.erase(c) && --per_ip[c->ip] == 0) per_ip.erase(c->ip);
  }

  // Arms the deadline of the read that follows: at it the read is cancelled.
  void Arm(const ConnPtr& c, int ms) {
    c->timed_out = false;
    c->timer.expires_after(std::chrono::milliseconds(ms));
    c->timer.async_wait([c](beast::error_code ec) {
      if (ec || c->at_worker) return;  // cancelled: the read ended first
      c->timed_out = true;
      beast::error_code ignored;
      c->socket.cancel(ignored);
    });
  }

  // The next request's header, all of it within one deadline.
  void ReadHeader(const ConnPtr& c) {
    c->parser.emplace();
    c->parser->body_limit(options.max_body_bytes);
    Arm(c, c->first ? options.read_timeout_ms : options.keep_alive_ms);
    http::async_read_header(c->socket, c->buffer, *c->parser, [this, c](beast::error_code ec, size_t) {
      c->timer.cancel();
      OnHeader(c, ec);
    });
  }

  void OnHeader(const ConnPtr& c, beast::error_code ec) {
    if (ec) {
      // Nothing of a request came: the peer closed or went idle. Else the
      // request is malformed or stalled.
      if (!c->parser->got_some()) return Close(c);
      if (c->timed_out) return Refuse(c, 408, "request header incomplete");
      if (ec == http::error::body_limit) return Refuse(c, 413, "request body too large");
      return Refuse(c, 400, "bad request: " + ec.message());
    }
    const HttpRequest& req = c->parser->get();
    if (std::optional<std::string> bad = HeaderViolation(req)) return Refuse(c, 400, "bad request: " + *bad);
    if (handlers.admit) {
      HttpReply reply;
      if (!handlers.admit(req, reply)) {
        reply.close = true;
        return Send(c, std::move(reply));
      }
    }
    const auto length = c->parser->content_length();
    const uint64_t need = length ? *length : req.chunked() ? options.max_body_bytes : 0;
    if (need > options.max_body_bytes) return Refuse(c, 413, "request body too large");
    if (!Reserve(*c, need)) {
      HttpReply reply;
      handlers.error(reply, 503, "server busy: too many request bodies in flight");
      reply.status = 503;
      reply.headers.emplace_back("Retry-After", "1");
      reply.close = true;
      return Send(c, std::move(reply));
    }
    // A client that waits for "100 Continue" before its body (curl does for
    // large ones) is told to go on.
    if (!c->parser->is_done() && beast::iequals(req[http::field::expect], "100-continue")) {
      auto go = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      Arm(c, options.write_timeout_ms);
      http::async_write(c->socket, *go, [this, c, go](beast::error_code e, size_t) {
        c->timer.cancel();
        if (e) return Close(c);
        ReadBody(c);
      });
      return;
    }
    ReadBody(c);
  }

  // The body, each receive within the read timeout; then to a worker.
  void ReadBody(const ConnPtr& c) {
    if (c->parser->is_done()) return Dispatch(c);
    Arm(c, options.read_timeout_ms);
    http::async_read_some(c->socket, c->buffer, *c->parser, [this, c](beast::error_code ec, size_t) {
      c->timer.cancel();
      if (ec == http::error::body_limit) return Refuse(c, 413, "request body too large");
      if (ec && !c->timed_out && (ec == net::error::eof || ec == net::error::connection_reset ||
                                  ec == net::error::operation_aborted))
        return Close(c);
      if (ec) return Refuse(c, 400, "request body incomplete: " + (c->timed_out ? "timed out" : ec.message()));
      ReadBody(c);
    });
  }

  // An error the server answers itself; the connection closes after it.
  void Refuse(const ConnPtr& c, unsigned status, const std::string& message) {
    HttpReply reply;
    handlers.error(reply, status, message);
    reply.status = status;
    reply.close = true;  // after a refused request the connection's byte stream cannot be trusted
    Send(c, std::move(reply));
  }

  // Writes a small answer from the reactor (a refusal), then closes.
  void Send(const ConnPtr& c, HttpReply reply) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(reply.status), 11);
    if (!reply.content_type.empty()) res->set(http::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) res->set(name, value);
    res->body() = std::move(reply.text);
    res->keep_alive(false);
    res->prepare_payload();
    Arm(c, options.write_timeout_ms);
    http::async_write(c->socket, *res, [this, c, res](beast::error_code, size_t) {
      c->timer.cancel();
      beast::error_code ignored;
      c->socket.shutdown(tcp::socket::shutdown_send, ignored);
      Close(c);
    });
  }

  bool Reserve(Conn& c, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (inflight_body + bytes > options.max_inflight_body_bytes) return false;
    inflight_body += bytes;
    c.reserved = bytes;
    return true;
  }
  void Release(Conn& c) {
    std::lock_guard<std::mutex> lock(mu);
    inflight_body -= c.reserved;
    c.reserved = 0;
  }

  void Dispatch(const ConnPtr& c) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return Close(c);
      c->at_worker = true;
      queue.push_back(c);
    }
    cv.notify_one();
  }

  // --- Workers: handling and answering ------------------------------------

  void Work() {
    Session session;
    for (;;) {
      ConnPtr c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [this] { return stopping || !queue.empty(); });
        if (stopping) return;
        c = std::move(queue.front());
        queue.pop_front();
        sessions.insert(&session);
      }
      const bool keep = Serve(session, c);
      {
        std::lock_guard<std::mutex> lock(mu);
        sessions.erase(&session);
      }
      idle.notify_all();
      Release(*c);
      net::post(io, [this, c, keep] {
        c->at_worker = false;
        if (!keep || !c->socket.is_open()) return Close(c);
        c->first = false;
        ReadHeader(c);
      });
    }
  }

  // Handles c's request and writes the answer on the worker's own I/O
  // context; true when the connection is kept alive for another request.
  bool Serve(Session& s, const ConnPtr& c) {
    const Clock::time_point start = Clock::now();
    beast::error_code ec;
    const int fd = c->socket.release(ec);
    if (ec) return false;
    s.io.socket().assign(protocol, fd, ec);
    if (ec) {
      ::close(fd);
      return false;
    }
    const HttpRequest& req = c->parser->get();
    HttpReply reply;
    auto watch = std::make_shared<PeerWatch>(fd);
    reply.peer_gone = [watch] { return watch->Gone(); };
    try {
      handlers.handle(req, reply);
    } catch (const std::exception&) {
      reply = HttpReply{};
      handlers.error(reply, 500, "internal error");
      reply.status = 500;
    }
    if (!req.keep_alive()) reply.close = true;
    if (handlers.answered) handlers.answered(req, reply);
    const bool sent = Respond(s, *c, &req, reply);
    if (handlers.done) handlers.done(std::chrono::duration<double>(Clock::now() - start).count());
    const bool keep = sent && !reply.close;
    // The descriptor goes back to the reactor's socket, open or not.
    const int back = s.io.socket().release(ec);
    if (ec) return false;
    c->socket.assign(protocol, back, ec);
    return keep && !ec;
  }

  // Sends `reply` to `req`; false if the connection failed. Whole, header
  // and body go in one gathered write; shaped, the header first and the
  // body 64 KiB at a time through the token buckets; streamed, a chunk per
  // piece.
  bool Respond(Session& s, Conn& c, const HttpRequest* req, const HttpReply& reply) {
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
      if (!options.connection_rate.empty() && !c.shaper) c.shaper = std::make_unique<LinkShaper>(options.connection_rate);
      if (c.shaper) c.shaper->Acquire(n);
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
  if (options.max_connections == 0 || options.max_connections_per_ip == 0)
    return Status::InvalidArgument("http server: connection limits must be > 0");
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
