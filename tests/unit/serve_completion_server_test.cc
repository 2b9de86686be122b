// The HTTP layer of llama-serve over a scripted engine (the real llama.cpp
// engine is tested in llama_serve_test.cc): routing, validation, streaming,
// queueing and refusal when full.
#include "serve/completion_server.h"
#include "http_test_client.h"
#include "service_util.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace cachegen::serve {
namespace {

using nlohmann::json;

// Emits the prompt's words one by one; can be held at the start of a request.
// The prompt "forever" generates for a minute, "prefill" works for a minute
// without text (a long prompt's prefill) unless aborted.
class WordEngine : public CompletionEngine {
 public:
  uint32_t slots() const override { return 1; }
  std::string model_name() const override { return "words"; }
  Result<CompletionResult> Complete(uint32_t, const CompletionRequest& req,
                                    const std::function<bool(const std::string&)>& on_text) override {
    {
      std::unique_lock lock(mu_);
      ++started_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !hold_; });
    }
    if (req.prompt == "fail") return Status::Internal("engine failed");
    if (req.prompt == "prefill") {
      while (prefill_steps_ < kForever && !aborted_) {
        if (req.client_gone && req.client_gone()) {
          cancelled_ = true;
          return Status::Unavailable("prefill cancelled: the client has gone");
        }
        ++prefill_steps_;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return Status::Unavailable("prefill aborted: the engine is stopping");
    }
    CompletionResult r;
    if (req.prompt == "forever") {  // a word a millisecond, for a minute, until told to stop
      while (emitted_ < kForever && on_text("w")) {
        ++emitted_;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      r.finish_reason = "stop";
      return r;
    }
    std::string word;
    for (char c : req.prompt + " ") {
      if (c != ' ') {
        word += c;
        continue;
      }
      if (r.timings.completion_tokens == req.max_tokens) break;
      r.text += word;
      ++r.timings.completion_tokens;
      if (!on_text(word)) break;
      word.clear();
    }
    r.finish_reason = r.timings.completion_tokens == req.max_tokens ? "length" : "stop";
    r.timings.ttft_ms = 1.5;
    return r;
  }
  void Abort() override { aborted_ = true; }
  void Hold(bool h) {
    std::lock_guard lock(mu_);
    hold_ = h;
    cv_.notify_all();
  }
  void WaitStarted(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return started_ >= n; });
  }
  static constexpr int kForever = 60000;
  std::atomic<int> emitted_{0};  // words of "forever" requests
  std::atomic<int> prefill_steps_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> cancelled_{false};  // a prefill saw its client gone

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int started_ = 0;
};

class CompletionServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CompletionServerOptions o;
    o.max_waiting = 1;
    auto s = CompletionServer::Start(&engine_, o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  testing_http::Client Client() { return testing_http::Client("127.0.0.1", server_->port()); }

  WordEngine engine_;
  std::unique_ptr<CompletionServer> server_;
};

TEST_F(CompletionServerTest, CompletesAndReportsTimings) {
  auto res = Client().Post("/v1/completions", R"({"prompt":"a b c","max_tokens":2})", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["model"], "words");
  EXPECT_EQ(j["timings"]["ttft_ms"], 1.5);
  auto models = Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "words");
  auto metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("cachegen_llama_ttft_seconds_count 1"), std::string::npos) << metrics->body;
}

TEST_F(CompletionServerTest, StreamsServerSentEvents) {
  auto res = Client().Post("/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"x y"}],"stream":true})", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_NE(res->content_type.find("text/event-stream"), std::string::npos);
  std::vector<json> events;
  size_t pos = 0;
  while ((pos = res->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = res->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string data = res->body.substr(pos + 6, end - pos - 6);
    if (data != "[DONE]") events.push_back(json::parse(data));
    pos = end;
  }
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events.back().contains("timings"));
  EXPECT_NE(res->body.rfind("data: [DONE]\n\n"), std::string::npos);
}

TEST_F(CompletionServerTest, RejectsBadRequestsAndEngineErrors) {
  auto bad = Client().Post("/v1/completions", R"({"prompt":"x","max_tokens":-3})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(json::parse(bad->body)["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
  auto garbage = Client().Post("/v1/completions", "{", "application/json");
  ASSERT_TRUE(garbage);
  EXPECT_EQ(garbage->status, 400);
  auto failed = Client().Post("/v1/completions", R"({"prompt":"fail"})", "application/json");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status, 500);
  auto missing = Client().Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(CompletionServerTest, QueuesThenRefusesWhenFull) {
  engine_.Hold(true);
  std::atomic<int> first_status{0}, second_status{0};
  std::thread first([&] {
    auto r = Client().Post("/v1/completions", R"({"prompt":"a"})", "application/json");
    first_status = r ? r->status : -1;
  });
  engine_.WaitStarted(1);  // the only slot is busy
  std::thread second([&] {
    auto r = Client().Post("/v1/completions", R"({"prompt":"b"})", "application/json");
    second_status = r ? r->status : -1;
  });
  // The second request waits in the queue (of 1); a third is refused at once.
  for (int i = 0; i < 2000; ++i) {
    auto h = Client().Get("/healthz");
    if (h && json::parse(h->body)["waiting"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto third = Client().Post("/v1/completions", R"({"prompt":"c"})", "application/json");
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503);
  engine_.Hold(false);
  first.join();
  second.join();
  EXPECT_EQ(first_status, 200);
  EXPECT_EQ(second_status, 200);
}

TEST_F(CompletionServerTest, StopEndsAGenerationThatIsNotStreamed) {
  // A non-streamed answer is sent when generation ends; Stop waits for the
  // running handlers, so it must end the generation, not wait it out.
  std::thread client([&] { Client().Post("/v1/completions", R"({"prompt":"forever"})", "application/json"); });
  while (engine_.emitted_ < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->Stop();
  client.join();
  EXPECT_LT(engine_.emitted_, WordEngine::kForever);
}

TEST_F(CompletionServerTest, StopAbortsAPrefill) {
  // A prefill sends no text, so only the engine's Abort ends it early; the
  // client is told to come back (503, Retry-After), not that the server failed.
  std::optional<testing_http::Answer> answer;
  std::thread client([&] { answer = Client().Post("/v1/completions", R"({"prompt":"prefill"})", "application/json"); });
  while (engine_.prefill_steps_ < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->Stop();
  client.join();
  EXPECT_TRUE(engine_.aborted_);
  EXPECT_LT(engine_.prefill_steps_, WordEngine::kForever);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 503) << answer->body;
  EXPECT_EQ(answer->retry_after, "1");
}

// A client that closes its connection mid-prefill cancels it: the slot is
// free for the next request, long before the prefill would have ended.
TEST_F(CompletionServerTest, AClientThatLeavesCancelsItsRequest) {
  const int fd = testing_service::OpenLoopback(server_->port());
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt":"prefill"})";
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  while (engine_.prefill_steps_ < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::close(fd);
  for (int i = 0; i < 2000 && !engine_.cancelled_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(engine_.cancelled_) << "the prefill went on for a client that had gone";
  EXPECT_LT(engine_.prefill_steps_, 3000);
  auto next = Client().Post("/v1/completions", R"({"prompt":"a b","max_tokens":2})", "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
}

// With an API key every route but /healthz needs it; without it the body is
// not read.
TEST(CompletionServerAuth, EveryRouteButHealthzNeedsTheApiKey) {
  WordEngine engine;
  CompletionServerOptions o;
  o.api_key = "k3y";
  auto s = CompletionServer::Start(&engine, o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  testing_http::Client anonymous("127.0.0.1", (*s)->port());
  testing_http::Client wrong("127.0.0.1", (*s)->port());
  wrong.Bearer("k3x");
  testing_http::Client right("127.0.0.1", (*s)->port());
  right.Bearer("k3y");
  EXPECT_EQ(anonymous.Get("/healthz")->status, 200);
  EXPECT_EQ(anonymous.Get("/v1/models")->status, 401);
  EXPECT_EQ(anonymous.Get("/metrics")->status, 401);
  EXPECT_EQ(wrong.Get("/v1/models")->status, 401);
  EXPECT_EQ(wrong.Post("/v1/completions", R"({"prompt":"a"})", "application/json")->status, 401);
  EXPECT_EQ(right.Get("/v1/models")->status, 200);
  auto done = right.Post("/v1/completions", R"({"prompt":"a b","max_tokens":2})", "application/json");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200);
  // Refused on the header: a body announced and never sent is not waited for.
  const std::string answer = testing_service::RawRequest(
      (*s)->port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n", false, 2000);
  EXPECT_EQ(testing_service::StatusOf(answer), 401) << answer;
}

}  // namespace
}  // namespace cachegen::serve
