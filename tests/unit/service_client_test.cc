// The service client (ConnectService) against servers that misbehave:
// truncated and malformed answers, bodies over the client's limit, stalls,
// and kept-alive connections the server closed. Each is an error (or, for
// the closed connection, a retry on a new one), never a crash, a hang or a
// frame that was not sent.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "cachegen/service.h"
#include "cachegen/store.h"
#include "service_util.h"

namespace cachegen {
namespace {

using testing_service::ScriptedServer;

const ChunkKey kKey = *ChunkKey::FromHex("00112233445566778899aabbccddeeff");

std::unique_ptr<ChunkStore> Connect(const ScriptedServer& server, ClientOptions options = {}) {
  auto c = ConnectService(server.url(), options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::string Answer(const std::string& status_and_headers, const std::string& body) {
  return "HTTP/1.1 " + status_and_headers + "\r\n\r\n" + body;
}

TEST(ServiceClient, TruncatedBodyIsAnErrorAfterOneRetry) {
  ScriptedServer server([](int) { return Answer("200 OK\r\nContent-Length: 1000", std::string(10, 'x')); }, true);
  auto client = Connect(server);
  auto got = client->Get(kKey, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kIOError) << got.status().ToString();
  EXPECT_EQ(server.requests(), 2) << "a transport failure is sent once more, on a new connection";
  EXPECT_EQ(client->stats().misses, 1u);
}

TEST(ServiceClient, MalformedAnswersAreErrors) {
  for (const std::string& bad : {std::string("HELLO\r\n\r\n"), std::string("HTTP/1.1 abc OK\r\n\r\n"),
                                 Answer("200 OK\r\nContent-Length: 5\r\nContent-Length: 7", "12345"),
                                 Answer("200 OK\r\nTransfer-Encoding: chunked", "zz\r\nabc\r\n0\r\n\r\n")}) {
    ScriptedServer server([&](int) { return bad; }, true);
    auto got = Connect(server)->Get(kKey, 0);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), StatusCode::kIOError) << bad << ": " << got.status().ToString();
  }
}

TEST(ServiceClient, BodiesOverTheLimitAreRefusedAndNotSentAgain) {
  ClientOptions small;
  small.max_frame_bytes = 100;
  // Announced: refused from the header, before any body byte.
  ScriptedServer announced([](int) { return Answer("200 OK\r\nContent-Length: 1000000000", ""); }, false);
  Status refused = Connect(announced, small)->Get(kKey, 0).status();
  EXPECT_NE(refused.message().find("larger than the client's limit"), std::string::npos) << refused.ToString();
  EXPECT_EQ(announced.requests(), 1);
  // Chunked, with no length announced: refused as it arrives.
  const std::string body = "c8\r\n" + std::string(200, 'x') + "\r\n0\r\n\r\n";
  ScriptedServer chunked([&](int) { return Answer("200 OK\r\nTransfer-Encoding: chunked", body); }, false);
  refused = Connect(chunked, small)->Get(kKey, 0).status();
  EXPECT_NE(refused.message().find("larger than the client's limit"), std::string::npos) << refused.ToString();
  EXPECT_EQ(chunked.requests(), 1);
}

TEST(ServiceClient, ABodyThatIsNotAFrameIsAVerificationMiss) {
  ScriptedServer server([](int) { return Answer("200 OK\r\nContent-Length: 5", "hello"); }, false);
  auto client = Connect(server);
  auto got = client->Get(kKey, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("failed verification"), std::string::npos) << got.status().ToString();
  EXPECT_EQ(client->stats().corrupt, 1u);
}

TEST(ServiceClient, ASilentServerTimesOut) {
  ScriptedServer server([](int) { return std::string(); }, false);
  ClientOptions quick;
  quick.read_timeout_ms = 100;
  auto client = Connect(server, quick);
  const auto start = std::chrono::steady_clock::now();
  Status st = client->Get(kKey, 0).status();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_LT(s, 5.0) << "two tries of a 100 ms read timeout";
}

TEST(ServiceClient, AServerThatTricklesIsCutOffByTheRequestTimeout) {
  // A byte every 20 ms: every receive is well within the read timeout, the
  // whole answer would take over 20 s.
  ScriptedServer server([](int) { return Answer("200 OK\r\nContent-Length: 1000", std::string(1000, 'x')); }, false,
                        20);
  ClientOptions bounded;
  bounded.read_timeout_ms = 1000;
  bounded.request_timeout_ms = 300;
  auto client = Connect(server, bounded);
  const auto start = std::chrono::steady_clock::now();
  Status st = client->Get(kKey, 0).status();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("request timeout (300 ms)"), std::string::npos) << st.ToString();
  EXPECT_LT(s, 5.0);
  EXPECT_EQ(server.requests(), 1) << "a request that ran out of time is not sent again";
}

TEST(ServiceClient, AConnectionTheServerClosedIsReplacedWithoutAnError) {
  // Every answer keeps the connection alive by HTTP/1.1's rules, and the
  // server closes it anyway: the client's next request finds it dead and
  // goes again on a new connection.
  ScriptedServer server([](int) { return Answer("404 Not Found\r\nContent-Length: 0", ""); }, true);
  auto client = Connect(server);
  for (int i = 0; i < 3; ++i) {
    auto got = client->Get(kKey, 0);
    EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << i << ": " << got.status().ToString();
  }
  EXPECT_EQ(server.requests(), 3);
}

TEST(ServiceClient, TimeoutsOfZeroAreRefused) {
  // A timeout of 0 would fail every request at once: refused up front.
  const std::string url = "http://127.0.0.1:1";
  for (int ClientOptions::*timeout :
       {&ClientOptions::connect_timeout_ms, &ClientOptions::read_timeout_ms, &ClientOptions::write_timeout_ms}) {
    for (int bad : {0, -1}) {
      ClientOptions o;
      o.*timeout = bad;
      EXPECT_EQ(ConnectService(url, o).status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  ClientOptions o;
  o.request_timeout_ms = -1;
  EXPECT_EQ(ConnectService(url, o).status().code(), StatusCode::kInvalidArgument);
  o.request_timeout_ms = 0;  // no whole-request bound: allowed
  EXPECT_TRUE(ConnectService(url, o).ok());
}

TEST(ServiceClient, NoServerIsAnErrorNamingTheService) {
  int port = 0;
  { ScriptedServer gone([](int) { return std::string(); }, true); port = gone.port(); }
  auto client = ConnectService("http://127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(client.ok());
  Status st = (*client)->Get(kKey, 0).status();
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace cachegen
