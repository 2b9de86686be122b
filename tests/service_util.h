// Helpers for the service tests: raw HTTP over a loopback socket, a small
// encoded context, checking streamed chunks, temp directories.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "kv/synthetic.h"

namespace cachegen::testing_service {

// Sends `request` raw to 127.0.0.1:port and returns the server's answer: up
// to the end of the first complete response (headers + Content-Length body),
// or what came until it closed or `timeout_ms` passed. With half_close the client shuts
// its sending side after the request (the server then sees a closed peer and
// may not answer at all).
inline std::string RawRequest(int port, const std::string& request, bool half_close = false, int timeout_ms = 3000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
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

}  // namespace cachegen::testing_service
