// A TCP socket whose operations run to completion on the calling thread, each
// bounded by its own timeout: the service client's connections
// (http_store.cc) and the service's sessions (server.cc). Beast applies
// timeouts to asynchronous operations only, so every operation is started
// asynchronously on the socket's own io_context, and that context is run
// for at most the timeout. A timed-out operation is cancelled, not the
// socket closed (as beast::tcp_stream would), so that a server can still
// answer a client that stalled.
#ifndef CACHEGEN_SERVICE_BLOCKING_STREAM_H_
#define CACHEGEN_SERVICE_BLOCKING_STREAM_H_

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>

#include <atomic>
#include <chrono>
#include <string>

namespace cachegen {

class BlockingStream {
 public:
  BlockingStream() = default;
  BlockingStream(const BlockingStream&) = delete;
  BlockingStream& operator=(const BlockingStream&) = delete;

  boost::asio::io_context& io() { return io_; }
  boost::asio::ip::tcp::socket& socket() { return socket_; }

  // Starts one asynchronous operation, start(done) with done(error_code,
  // size_t), and runs it to its end, at most timeout_ms (then
  // beast::error::timeout), or until Interrupt() (then operation_aborted).
  template <typename Start>
  boost::beast::error_code Run(int timeout_ms, const Start& start) {
    namespace net = boost::asio;
    boost::beast::error_code result;
    bool done = false;
    start([&result, &done](boost::beast::error_code ec, size_t) {
      result = ec;
      done = true;
    });
    io_.restart();
    if (!interrupted_) io_.run_for(std::chrono::milliseconds(timeout_ms));
    if (done) return result;
    // Timed out or interrupted: cancel the operation (interrupted: close
    // the socket), and run until its handler has run, before `result` and
    // `done` are gone (an Interrupt() still under way may stop one more run).
    const bool interrupted = interrupted_;
    boost::beast::error_code ignored;
    if (interrupted) socket_.close(ignored);
    else socket_.cancel(ignored);
    while (!done) {
      io_.restart();
      io_.run();
    }
    return interrupted ? boost::beast::error_code(net::error::operation_aborted)
                       : boost::beast::error_code(boost::beast::error::timeout);
  }

  // Resolves host (not bounded by the timeout) and connects, within timeout_ms.
  boost::beast::error_code Connect(const std::string& host, int port, int timeout_ms) {
    namespace net = boost::asio;
    using tcp = net::ip::tcp;
    boost::beast::error_code ec;
    const tcp::resolver::results_type endpoints = tcp::resolver(io_).resolve(host, std::to_string(port), ec);
    if (ec) return ec;
    return Run(timeout_ms, [&](auto done) {
      net::async_connect(socket_, endpoints, [done](boost::beast::error_code e, const tcp::endpoint&) { done(e, 0); });
    });
  }

  // From any thread: the operation running now, and every later one, ends
  // at once with operation_aborted.
  void Interrupt() {
    interrupted_ = true;
    io_.stop();
  }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_{io_};
  std::atomic<bool> interrupted_{false};
};

}  // namespace cachegen

#endif  // CACHEGEN_SERVICE_BLOCKING_STREAM_H_
