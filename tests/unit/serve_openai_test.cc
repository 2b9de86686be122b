#include "serve/openai.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace cachegen::serve {
namespace {

using nlohmann::json;

TEST(OpenAIRequest, ParsesCompletionWithStringPrompt) {
  auto r = ParseCompletionRequest(
      R"({"model":"m","prompt":"Once upon","max_tokens":7,"temperature":0,"stop":["\n"],"stream":true,"seed":3})",
      false, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->chat);
  EXPECT_EQ(r->prompt, "Once upon");
  EXPECT_EQ(r->max_tokens, 7u);
  EXPECT_EQ(r->temperature, 0.0f);
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->seed, 3u);
}

TEST(OpenAIRequest, ParsesTokenPromptAndChat) {
  auto t = ParseCompletionRequest(R"({"prompt":[1,2,3]})", false, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  auto c = ParseCompletionRequest(
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],
          "max_completion_tokens":5})",
      true, {});
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->messages.size(), 2u);
  EXPECT_EQ(c->messages[1].content, "hi");
  EXPECT_EQ(c->max_tokens, 5u);
}

TEST(OpenAIRequest, RejectsBadFieldsWithTheirName) {
  RequestLimits lim;
  lim.max_tokens = 100;
  struct Case {
    const char* body;
    bool chat;
    const char* field;
  } cases[] = {
      {"not json", false, "JSON"},
      {"[1,2]", false, "JSON"},
      {R"({})", false, "prompt"},
      {R"({"prompt":""})", false, "prompt"},
      {R"({"prompt":[-1]})", false, "prompt"},
      {R"({"prompt":"x","max_tokens":0})", false, "max_tokens"},
      {R"({"prompt":"x","max_tokens":101})", false, "max_tokens"},
      {R"({"prompt":"x","temperature":"hot"})", false, "temperature"},
      {R"({"prompt":"x","top_p":2})", false, "top_p"},
      {R"({"prompt":"x","stop":[1]})", false, "stop"},
      {R"({"prompt":"x","stop":["a","b","c","d","e"]})", false, "stop"},
      {R"({"prompt":"x","stream":"yes"})", false, "stream"},
      {R"({"messages":[]})", true, "messages"},
      {R"({"messages":[{"role":"user"}]})", true, "content"},
  };
  for (const Case& c : cases) {
    auto r = ParseCompletionRequest(c.body, c.chat, lim);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << c.body << " -> " << r.status().message();
  }
  RequestLimits small;
  small.max_prompt_bytes = 16;
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt":"a much longer prompt than allowed"})", false, small).ok());
}

TEST(OpenAIResponse, CarriesTextUsageAndTimings) {
  CompletionRequest req;
  req.chat = true;
  req.model = "stories";
  CompletionResult res;
  res.text = "The end.";
  res.finish_reason = "stop";
  res.timings.prompt_tokens = 300;
  res.timings.cached_tokens = 256;
  res.timings.recomputed_tokens = 44;
  res.timings.completion_tokens = 3;
  res.timings.ttft_ms = 12.5;
  json j = json::parse(CompletionResponse(req, "cmpl-1", 1700000000, res));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "The end.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 303);
  EXPECT_EQ(j["timings"]["cached_tokens"], 256);
  EXPECT_EQ(j["timings"]["ttft_ms"], 12.5);
  for (const char* k : {"lookup_ms", "transfer_ms", "decode_ms", "inject_ms", "prefill_ms", "recomputed_tokens"})
    EXPECT_TRUE(j["timings"].contains(k)) << k;
}

TEST(OpenAIResponse, StreamEventsAreServerSentEvents) {
  CompletionRequest req;
  const std::string ev = StreamEvent(req, "id", 1, "Hel\xff", "", nullptr);  // invalid UTF-8 is replaced
  ASSERT_EQ(ev.rfind("data: ", 0), 0u);
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  json j = json::parse(ev.substr(6));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(j.contains("timings"));
  Timings t;
  t.completion_tokens = 2;
  json last = json::parse(StreamEvent(req, "id", 1, "", "length", &t).substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["timings"]["completion_tokens"], 2);
  EXPECT_EQ(StreamDone(), "data: [DONE]\n\n");
  json err = json::parse(ErrorBody(400, "field 'prompt': required"));
  EXPECT_EQ(err["error"]["code"], 400);
}

TEST(StopStrings, FindAndHoldBackPartialMatches) {
  const std::vector<std::string> stop = {"\n\n", "THE END"};
  EXPECT_EQ(FindStop("abc\n\ndef", stop), 3u);
  EXPECT_EQ(FindStop("abc THE END", stop), 4u);
  EXPECT_FALSE(FindStop("abc", stop).has_value());
  EXPECT_EQ(StreamableLength("abc", stop), 3u);
  EXPECT_EQ(StreamableLength("abc\n", stop), 3u);       // "\n" may become "\n\n"
  EXPECT_EQ(StreamableLength("abc THE E", stop), 4u);  // " THE E" could not, "THE E" could
  EXPECT_EQ(StreamableLength("", stop), 0u);
  EXPECT_EQ(StreamableLength("abc", {}), 3u);
}

}  // namespace
}  // namespace cachegen::serve
