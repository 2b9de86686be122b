// The OpenAI-compatible wire protocol of `cachegen llama-serve`: request
// parsing and response building, kept apart from the engine so it can be
// tested without a model.
//
// Supported: POST /v1/completions (prompt: string or array of token ids) and
// POST /v1/chat/completions (messages: [{role, content: string}]), each
// streaming (server-sent events) or not. Fields outside the subset below are
// ignored, as OpenAI-compatible servers commonly do; fields inside it with a
// wrong type or range are a 400 with a message naming the field.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cachegen/status.h"

namespace cachegen::serve {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;                      // echoed back; any value is accepted
  std::string prompt;                     // completions with a string prompt
  std::vector<int32_t> prompt_tokens;     // completions with a token-id prompt
  std::vector<ChatMessage> messages;      // chat
  uint32_t max_tokens = 16;
  float temperature = 1.0f;               // 0 = greedy
  float top_p = 1.0f;
  uint64_t seed = 0xffffffffu;            // llama.cpp's "random seed"
  std::vector<std::string> stop;          // up to 4 stop strings
  bool stream = false;
  // cachegen extension: this request's time-to-first-token budget for the KV
  // transfer planner (0 = the server's --ttft-target).
  double ttft_target_ms = 0;
  // Set by the server, not parsed: true once the client has gone. An engine
  // polls it to stop the prefill and generation of a request no one waits
  // for. Empty: never.
  std::function<bool()> client_gone;
};

// Limits applied while parsing (the server's flags).
struct RequestLimits {
  uint32_t max_tokens = 4096;
  size_t max_prompt_bytes = 1 << 20;
};

// Parses a request body. `chat` selects the endpoint's schema.
Result<CompletionRequest> ParseCompletionRequest(const std::string& body, bool chat, const RequestLimits& limits);

// Where the time to first token went (all in milliseconds), reported in every
// response's "timings" object.
struct Timings {
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;      // tokens whose KV came from the store
  uint32_t recomputed_tokens = 0;  // tokens prefilled by the engine
  uint32_t completion_tokens = 0;
  double lookup_ms = 0, transfer_ms = 0, decode_ms = 0, inject_ms = 0, prefill_ms = 0, ttft_ms = 0;
  double generation_ms = 0;
  uint64_t transfer_bytes = 0;
  std::vector<uint32_t> levels;  // quality level of each cached chunk
};

struct CompletionResult {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  Timings timings;
};

// The whole non-streaming response body.
std::string CompletionResponse(const CompletionRequest& req, const std::string& id, int64_t created,
                               const CompletionResult& result);

// One server-sent event carrying a piece of generated text ("data: {...}\n\n").
// `finish_reason` is empty except on the last piece; `timings` only on the last.
std::string StreamEvent(const CompletionRequest& req, const std::string& id, int64_t created, const std::string& piece,
                        const std::string& finish_reason, const Timings* timings);
// The terminating event, "data: [DONE]\n\n".
std::string StreamDone();

// An OpenAI-style error body {"error":{"message","type","code"}}.
std::string ErrorBody(int http_status, const std::string& message);

// Finds the earliest occurrence of any stop string in `text`; returns its
// offset, or std::nullopt. Used to cut generation at a stop string.
std::optional<size_t> FindStop(const std::string& text, const std::vector<std::string>& stop);
// How much of `text` can be sent while streaming: all of it except a tail
// that could still grow into a stop string.
size_t StreamableLength(const std::string& text, const std::vector<std::string>& stop);

}  // namespace cachegen::serve
