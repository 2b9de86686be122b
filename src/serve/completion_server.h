// The HTTP front of `cachegen llama-serve`: OpenAI-compatible endpoints over
// a CompletionEngine, with a fixed number of engine slots and a bounded queue.
//
//   POST /v1/completions, POST /v1/chat/completions  (stream: true → SSE)
//   GET  /v1/models, GET /healthz, GET /metrics (Prometheus text)
//
// Errors: 400 for malformed requests (the message names the field), 401
// without the API key (when one is set), 503 with Retry-After when every slot
// is busy and the queue is full or the server is stopping, 500 when the
// engine fails. A request whose client closes its connection is cancelled:
// its prefill and generation stop (CompletionRequest::client_gone).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cachegen/status.h"
#include "serve/openai.h"

namespace cachegen::serve {

// What the server needs from an engine. Complete runs on one slot at a time
// (the server never calls it twice concurrently for the same slot).
class CompletionEngine {
 public:
  virtual ~CompletionEngine() = default;
  virtual uint32_t slots() const = 0;
  virtual std::string model_name() const = 0;
  // Generates for `req` on `slot`. `on_text` receives each new piece of the
  // completion as it is generated (already cut at stop strings); it returns
  // false when the client went away, and the engine then stops early.
  virtual Result<CompletionResult> Complete(uint32_t slot, const CompletionRequest& req,
                                            const std::function<bool(const std::string&)>& on_text) = 0;
  // Extra Prometheus lines (the engine's own counters); may be empty.
  virtual std::string MetricsText() const { return {}; }
  // Shutdown: running and later Completes end early with an error,
  // mid-prefill too, rather than at their next piece of text. For good: an
  // engine that has aborted serves no more.
  virtual void Abort() {}
};

struct CompletionServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                // 0: an ephemeral port
  uint32_t max_waiting = 16;   // requests queued for a slot beyond which 503
  RequestLimits limits;
  int read_timeout_ms = 30000;
  uint32_t http_threads = 0;   // 0: slots + max_waiting + 4
  // Non-empty: every route but /healthz needs "Authorization: Bearer
  // <api_key>" (401 otherwise, checked before the body is read).
  std::string api_key;
};

class CompletionServer {
 public:
  // Binds and serves on background threads; `engine` must outlive the server.
  static Result<std::unique_ptr<CompletionServer>> Start(CompletionEngine* engine,
                                                         const CompletionServerOptions& options);
  virtual ~CompletionServer() = default;
  virtual int port() const = 0;
  // Stops accepting, ends every generation at its next piece of text
  // (streamed or not) and every connection's I/O, waits for running
  // requests, joins the threads. A prompt being prefilled ends early where
  // the engine can abort it (CompletionEngine::Abort; the llama engine on
  // the CPU backend), else runs to its end first. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace cachegen::serve
