#include "serve/openai.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace cachegen::serve {
namespace {

using nlohmann::json;

Status FieldError(const std::string& field, const std::string& want) {
  return Status::InvalidArgument("field '" + field + "': " + want);
}

// Reads an optional number field into `out`, checking [lo, hi].
template <typename T>
Status ReadNumber(const json& j, const char* field, double lo, double hi, T* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return FieldError(field, "want a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return FieldError(field, "want a number in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status ReadPrompt(const json& j, const RequestLimits& limits, CompletionRequest* r) {
  auto it = j.find("prompt");
  if (it == j.end()) return FieldError("prompt", "required");
  if (it->is_string()) {
    r->prompt = it->get<std::string>();
    if (r->prompt.empty()) return FieldError("prompt", "must not be empty");
    return Status::Ok();
  }
  if (!it->is_array() || it->empty()) return FieldError("prompt", "want a string or a non-empty array of token ids");
  if (it->size() > limits.max_prompt_bytes / 4) return FieldError("prompt", "too many tokens");
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
      return FieldError("prompt", "token ids must be non-negative integers");
    r->prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return Status::Ok();
}

Status ReadMessages(const json& j, CompletionRequest* r) {
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array() || it->empty()) return FieldError("messages", "want a non-empty array");
  for (const json& m : *it) {
    if (!m.is_object()) return FieldError("messages", "each message must be an object");
    auto role = m.find("role");
    auto content = m.find("content");
    if (role == m.end() || !role->is_string()) return FieldError("messages[].role", "want a string");
    if (content == m.end() || !content->is_string()) return FieldError("messages[].content", "want a string");
    r->messages.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return Status::Ok();
}

Status ReadStop(const json& j, CompletionRequest* r) {
  auto it = j.find("stop");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (it->is_string()) {
    r->stop.push_back(it->get<std::string>());
  } else if (it->is_array() && it->size() <= 4) {
    for (const json& s : *it) {
      if (!s.is_string()) return FieldError("stop", "want a string or up to 4 strings");
      r->stop.push_back(s.get<std::string>());
    }
  } else {
    return FieldError("stop", "want a string or up to 4 strings");
  }
  for (const std::string& s : r->stop)
    if (s.empty()) return FieldError("stop", "stop strings must not be empty");
  return Status::Ok();
}

json TimingsJson(const Timings& t) {
  return {{"prompt_tokens", t.prompt_tokens},   {"cached_tokens", t.cached_tokens},
          {"recomputed_tokens", t.recomputed_tokens}, {"completion_tokens", t.completion_tokens},
          {"lookup_ms", t.lookup_ms},           {"transfer_ms", t.transfer_ms},
          {"decode_ms", t.decode_ms},           {"inject_ms", t.inject_ms},
          {"prefill_ms", t.prefill_ms},         {"ttft_ms", t.ttft_ms},
          {"generation_ms", t.generation_ms},   {"transfer_bytes", t.transfer_bytes},
          {"levels", t.levels}};
}

json Usage(const Timings& t) {
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.completion_tokens},
          {"total_tokens", t.prompt_tokens + t.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", t.cached_tokens}}}};
}

json Choice(const CompletionRequest& req, const std::string& text, const std::string& finish_reason, bool delta) {
  json c = {{"index", 0}};
  if (req.chat) {
    json msg = {{"content", text}};
    if (!delta || !text.empty()) msg["role"] = "assistant";
    c[delta ? "delta" : "message"] = msg;
  } else {
    c["text"] = text;
  }
  c["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  return c;
}

}  // namespace

Result<CompletionRequest> ParseCompletionRequest(const std::string& body, bool chat, const RequestLimits& limits) {
  if (body.size() > limits.max_prompt_bytes) return Status::InvalidArgument("request body too large");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("request body is not a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (auto it = j.find("model"); it != j.end() && it->is_string()) r.model = it->get<std::string>();
  Status st = chat ? ReadMessages(j, &r) : ReadPrompt(j, limits, &r);
  if (!st.ok()) return st;
  // OpenAI's chat API renamed max_tokens to max_completion_tokens; accept both.
  for (const char* f : {"max_tokens", "max_completion_tokens", "n_predict"}) {
    st = ReadNumber(j, f, 1, limits.max_tokens, &r.max_tokens);
    if (!st.ok()) return st;
  }
  if (!(st = ReadNumber(j, "temperature", 0, 10, &r.temperature)).ok()) return st;
  if (!(st = ReadNumber(j, "top_p", 0, 1, &r.top_p)).ok()) return st;
  if (!(st = ReadNumber(j, "seed", 0, 4294967295.0, &r.seed)).ok()) return st;
  if (!(st = ReadNumber(j, "ttft_target_ms", 0, 3.6e6, &r.ttft_target_ms)).ok()) return st;
  if (!(st = ReadStop(j, &r)).ok()) return st;
  if (auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError("stream", "want true or false");
    r.stream = it->get<bool>();
  }
  return r;
}

std::string CompletionResponse(const CompletionRequest& req, const std::string& id, int64_t created,
                               const CompletionResult& result) {
  json j = {{"id", id},
            {"object", req.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", json::array({Choice(req, result.text, result.finish_reason, false)})},
            {"usage", Usage(result.timings)},
            {"timings", TimingsJson(result.timings)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string StreamEvent(const CompletionRequest& req, const std::string& id, int64_t created, const std::string& piece,
                        const std::string& finish_reason, const Timings* timings) {
  json j = {{"id", id},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", json::array({Choice(req, piece, finish_reason, true)})}};
  if (timings) {
    j["usage"] = Usage(*timings);
    j["timings"] = TimingsJson(*timings);
  }
  // Generated text may hold invalid UTF-8 mid-character; replace rather than throw.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string StreamDone() { return "data: [DONE]\n\n"; }

std::string ErrorBody(int http_status, const std::string& message) {
  const char* type = http_status >= 500 ? "server_error" : "invalid_request_error";
  return json({{"error", {{"message", message}, {"type", type}, {"code", http_status}}}})
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<size_t> FindStop(const std::string& text, const std::vector<std::string>& stop) {
  std::optional<size_t> best;
  for (const std::string& s : stop) {
    const size_t at = text.find(s);
    if (at != std::string::npos && (!best || at < *best)) best = at;
  }
  return best;
}

size_t StreamableLength(const std::string& text, const std::vector<std::string>& stop) {
  size_t keep = 0;  // longest tail of text that is a proper prefix of a stop string
  for (const std::string& s : stop)
    for (size_t n = std::min(s.size() - 1, text.size()); n > keep; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  return text.size() - keep;
}

}  // namespace cachegen::serve
