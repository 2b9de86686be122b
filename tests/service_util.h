// Helpers for the service tests: raw HTTP over a loopback socket, a small
// encoded context, checking streamed chunks, temp directories, a store to
// wrap.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "kv/synthetic.h"

namespace cachegen::testing_service {

// Sends `request` raw to 127.0.0.1:port and returns the server's answer: up
// to the end of the first complete response (headers + Content-Length body),
// or what came until it closed or `timeout_ms` passed. With half_close the client shuts
// its sending side after the request (the server then sees a closed peer and
// may not answer at all).
// A connected loopback socket to 127.0.0.1:port, from the loopback address
// `from` (127.0.0.x: another client address), receives and sends bounded
// by timeout_ms; -1 on failure.
inline int OpenLoopback(int port, int timeout_ms = 3000, const char* from = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (from) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &local.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

inline std::string RawRequest(int port, const std::string& request, bool half_close = false, int timeout_ms = 3000) {
  const int fd = OpenLoopback(port, timeout_ms);
  if (fd < 0) return "";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    const size_t end = out.find("\r\n\r\n");
    if (end == std::string::npos) continue;
    size_t length = 0;
    const size_t cl = out.find("Content-Length: ");
    if (cl != std::string::npos && cl < end) length = std::strtoull(out.c_str() + cl + 16, nullptr, 10);
    if (out.size() >= end + 4 + length) break;
  }
  ::close(fd);
  return out;
}

// A loopback server that answers each request (read up to its blank line;
// requests with bodies are not expected) with canned bytes, to test the
// client against broken and hostile servers. answer(n) gives the bytes for
// the n-th request (0-based); an empty answer says nothing and holds the
// connection until the client gives up. With close_after, the connection is
// closed after each answer (without "Connection: close"). One connection at
// a time, on one thread.
class ScriptedServer {
 public:
  // trickle_ms > 0: each answer goes out a byte at a time, trickle_ms apart.
  ScriptedServer(std::function<std::string(int)> answer, bool close_after, int trickle_ms = 0)
      : answer_(std::move(answer)), close_after_(close_after), trickle_ms_(trickle_ms) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 16) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "scripted server: no loopback socket";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  // Waits up to 20 ms for fd to be readable; false on timeout.
  static bool Readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 20) > 0;
  }
  void Run() {
    while (!stop_) {
      if (!Readable(listen_fd_)) continue;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      Serve(fd);
      ::close(fd);
    }
  }
  void Serve(int fd) {
    std::string in;
    char buf[4096];
    while (!stop_) {
      if (!Readable(fd)) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;  // the client closed it
      in.append(buf, static_cast<size_t>(n));
      size_t end;
      while ((end = in.find("\r\n\r\n")) != std::string::npos) {
        in.erase(0, end + 4);
        const std::string out = answer_(requests_++);
        if (out.empty()) continue;  // say nothing: the client times out
        size_t sent = 0;
        while (sent < out.size()) {
          if (stop_) return;
          const size_t piece = trickle_ms_ > 0 ? 1 : out.size() - sent;
          const ssize_t k = ::send(fd, out.data() + sent, piece, MSG_NOSIGNAL);
          if (k <= 0) return;
          sent += static_cast<size_t>(k);
          if (trickle_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(trickle_ms_));
        }
        if (close_after_) return;
      }
    }
  }

  std::function<std::string(int)> answer_;
  bool close_after_;
  int trickle_ms_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<int> requests_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The status code of a raw response ("HTTP/1.1 400 Bad Request" -> 400), 0 if none.
inline int StatusOf(const std::string& response) {
  if (response.size() < 12 || response.compare(0, 5, "HTTP/") != 0) return 0;
  return std::atoi(response.c_str() + 9);
}

struct TestContext {
  std::vector<TokenId> tokens;
  KVTensor kv;
  ChunkKey root;
  uint32_t chunk_tokens = 16;
  CodecConfig config;
};

// A synthetic 2-layer context of `tokens` tokens in chunks of 16 at 3 levels.
inline TestContext MakeContext(uint32_t tokens = 56, uint64_t seed = 7) {
  TestContext c;
  c.kv = std::move(SyntheticKV({2, 2, 32, tokens}, DType::kF16, seed)).value();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (uint32_t i = 0; i < tokens; ++i) c.tokens.push_back(static_cast<TokenId>(rng() % 32000));
  c.root = ChainRoot("test-model", "test-profile", c.chunk_tokens);
  c.config.chunk_tokens = c.chunk_tokens;
  c.config.levels = 3;
  c.config.threads = 1;
  return c;
}

// A delivered chunk equals a direct decode of its frame encoded here from c.kv.
inline void ExpectDirectDecode(const TestContext& c, const StreamedChunk& s) {
  auto enc = Encoder::Create(c.config);
  ASSERT_TRUE(enc.ok());
  const uint32_t start = s.index * c.chunk_tokens;
  const uint32_t n = std::min<uint32_t>(c.chunk_tokens, c.kv.shape().tokens - start);
  EXPECT_EQ(s.token_start, start);
  auto frames = enc->EncodeChunk(c.kv.view().Tokens(start, n), start, c.kv.shape().tokens);
  ASSERT_TRUE(frames.ok());
  ASSERT_LT(s.level, frames->size());
  KVTensor direct(s.kv->shape(), s.kv->dtype());
  ASSERT_TRUE(DecodeFrame((*frames)[s.level], direct.view()).ok());
  ASSERT_EQ(direct.size_bytes(), s.kv->size_bytes());
  EXPECT_EQ(std::memcmp(direct.data(), s.kv->data(), direct.size_bytes()), 0) << "chunk " << s.index;
}

inline std::filesystem::path TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             (name + "-" + std::to_string(::getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir;
}

// A store that passes every call on to `inner`: tests derive from it to
// watch, delay or hold reads (overriding Get).
class ForwardingStore : public ChunkStore {
 public:
  explicit ForwardingStore(ChunkStore* inner) : inner_(inner) {}
  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    return inner_->Put(key, level, frame);
  }
  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override { return inner_->Get(key, level); }
  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override { return inner_->Size(key, level); }
  Status Delete(const ChunkKey& key, uint32_t level) override { return inner_->Delete(key, level); }
  StoreStats stats() const override { return inner_->stats(); }
  std::string uri() const override { return inner_->uri(); }

 private:
  ChunkStore* inner_;
};

}  // namespace cachegen::testing_service
