#include "serve/completion_server.h"

#include "service/bearer.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "serve/slot_pool.h"
#include "service/http_server.h"

namespace cachegen::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Request counters and a TTFT histogram, rendered as Prometheus text.
class ServerMetrics {
 public:
  void Count(int status) {
    std::lock_guard lock(mu_);
    ++requests_;
    if (status >= 400) ++errors_[status >= 500 ? 1 : 0];
  }
  void Completed(const Timings& t) {
    std::lock_guard lock(mu_);
    prompt_tokens_ += t.prompt_tokens;
    cached_tokens_ += t.cached_tokens;
    completion_tokens_ += t.completion_tokens;
    transfer_bytes_ += t.transfer_bytes;
    for (size_t i = 0; i < kBuckets; ++i)
      if (t.ttft_ms / 1000.0 <= kBounds[i]) ++ttft_buckets_[i];
    ++ttft_count_;
    ttft_sum_s_ += t.ttft_ms / 1000.0;
  }
  std::string Text() const {
    std::lock_guard lock(mu_);
    std::string s;
    auto counter = [&](const char* name, const std::string& labels, uint64_t v) {
      s += std::string(name) + labels + " " + std::to_string(v) + "\n";
    };
    s += "# TYPE cachegen_llama_requests_total counter\n";
    counter("cachegen_llama_requests_total", "", requests_);
    s += "# TYPE cachegen_llama_errors_total counter\n";
    counter("cachegen_llama_errors_total", "{class=\"4xx\"}", errors_[0]);
    counter("cachegen_llama_errors_total", "{class=\"5xx\"}", errors_[1]);
    s += "# TYPE cachegen_llama_tokens_total counter\n";
    counter("cachegen_llama_tokens_total", "{kind=\"prompt\"}", prompt_tokens_);
    counter("cachegen_llama_tokens_total", "{kind=\"cached\"}", cached_tokens_);
    counter("cachegen_llama_tokens_total", "{kind=\"completion\"}", completion_tokens_);
    s += "# TYPE cachegen_llama_transfer_bytes_total counter\n";
    counter("cachegen_llama_transfer_bytes_total", "", transfer_bytes_);
    s += "# TYPE cachegen_llama_ttft_seconds histogram\n";
    for (size_t i = 0; i < kBuckets; ++i)
      counter("cachegen_llama_ttft_seconds_bucket", "{le=\"" + nlohmann::json(kBounds[i]).dump() + "\"}",
              ttft_buckets_[i]);
    counter("cachegen_llama_ttft_seconds_bucket", "{le=\"+Inf\"}", ttft_count_);
    s += "cachegen_llama_ttft_seconds_sum " + std::to_string(ttft_sum_s_) + "\n";
    counter("cachegen_llama_ttft_seconds_count", "", ttft_count_);
    return s;
  }

 private:
  static constexpr size_t kBuckets = 10;
  static constexpr double kBounds[kBuckets] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  mutable std::mutex mu_;
  uint64_t requests_ = 0, errors_[2] = {0, 0};
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, transfer_bytes_ = 0;
  uint64_t ttft_buckets_[kBuckets] = {};
  uint64_t ttft_count_ = 0;
  double ttft_sum_s_ = 0;
};

class ServerImpl final : public CompletionServer {
 public:
  ServerImpl(CompletionEngine* engine, const CompletionServerOptions& options)
      : engine_(engine), options_(options), pool_(engine->slots(), options.max_waiting) {}
  ~ServerImpl() override { Stop(); }

  Status Bind() {
    HttpServerOptions o;
    o.host = options_.host;
    o.port = options_.port;
    o.threads = options_.http_threads ? options_.http_threads : engine_->slots() + options_.max_waiting + 4;
    o.read_timeout_ms = options_.read_timeout_ms;
    o.max_body_bytes = options_.limits.max_prompt_bytes;
    HttpHandlers h;
    h.handle = [this](const HttpRequest& req, HttpReply& res) { Route(req, res); };
    h.error = [this](HttpReply& res, unsigned status, const std::string& message) { Error(res, status, message); };
    if (!options_.api_key.empty()) {
      h.admit = [this](const HttpRequest& req, HttpReply& res) {
        if (HttpPath(req) == "/healthz") return true;
        const auto auth = req[boost::beast::http::field::authorization];
        if (BearerTokenMatches(std::string_view(auth.data(), auth.size()), options_.api_key)) return true;
        Error(res, 401, auth.empty() ? "missing API key (Authorization: Bearer)" : "bad API key");
        res.headers.emplace_back("WWW-Authenticate", "Bearer");
        return false;
      };
    }
    Result<std::unique_ptr<HttpServer>> server = HttpServer::Start(o, std::move(h));
    if (!server.ok()) return server.status();
    server_ = std::move(server).value();
    return Status::Ok();
  }

  int port() const override { return server_->port(); }
  void Stop() override {
    std::lock_guard lock(stop_mu_);
    // Generation ends at its next piece of text (the engine's callback), a
    // prefill where the engine can abort it (CompletionEngine::Abort);
    // HttpServer::Stop waits for every running handler.
    if (stopping_.exchange(true)) return;
    engine_->Abort();
    pool_.Close();
    if (server_) server_->Stop();
  }

 private:
  void Reply(HttpReply& res, unsigned status, const std::string& body, const char* type = "application/json") {
    res.status = status;
    res.content_type = type;
    res.text = body;
    metrics_.Count(static_cast<int>(status));
  }
  void Error(HttpReply& res, unsigned status, const std::string& message) {
    Reply(res, status, ErrorBody(static_cast<int>(status), message));
  }
  void Unavailable(HttpReply& res, const std::string& message) {
    Error(res, 503, message);
    res.headers.emplace_back("Retry-After", "1");
  }
  // An engine's failure: the request's fault (400), the server stopping or
  // the client gone (503: try again), or the engine's (500).
  static unsigned EngineErrorCode(const Status& st) {
    if (st.code() == StatusCode::kInvalidArgument) return 400;
    return st.code() == StatusCode::kUnavailable ? 503 : 500;
  }
  void EngineError(HttpReply& res, const Status& st) {
    const unsigned code = EngineErrorCode(st);
    if (code == 503) return Unavailable(res, st.message());
    Error(res, code, st.message());
  }

  void Route(const HttpRequest& req, HttpReply& res) {
    const std::string_view path = HttpPath(req);
    const bool get = req.method() == boost::beast::http::verb::get;
    const bool post = req.method() == boost::beast::http::verb::post;
    const std::string_view body(reinterpret_cast<const char*>(req.body().data()), req.body().size());
    if (path == "/healthz" && get) {
      return Reply(res, 200, nlohmann::json({{"status", "ok"}, {"slots", engine_->slots()}, {"busy", pool_.busy()},
                                             {"waiting", pool_.waiting()}})
                                 .dump());
    }
    if (path == "/metrics" && get) return Reply(res, 200, metrics_.Text() + engine_->MetricsText(), "text/plain; version=0.0.4");
    if (path == "/v1/models" && get) {
      nlohmann::json m = {{"id", engine_->model_name()}, {"object", "model"}, {"owned_by", "cachegen"}};
      return Reply(res, 200, nlohmann::json({{"object", "list"}, {"data", {m}}}).dump());
    }
    if (path == "/v1/completions" && post) return Handle(body, res, false);
    if (path == "/v1/chat/completions" && post) return Handle(body, res, true);
    Error(res, 404, "HTTP 404");
  }

  std::string NextId() { return "cmpl-cachegen-" + std::to_string(++next_id_); }

  void Handle(std::string_view http_body, HttpReply& res, bool chat) {
    Result<CompletionRequest> parsed = ParseCompletionRequest(std::string(http_body), chat, options_.limits);
    if (!parsed.ok()) return Error(res, 400, parsed.status().message());
    if (parsed->model.empty()) parsed->model = engine_->model_name();
    // A client that closes its connection cancels the request.
    parsed->client_gone = res.peer_gone;
    std::optional<uint32_t> slot = pool_.Acquire();
    if (!slot) return Unavailable(res, "server busy: every slot is in use and the queue is full");
    auto lease = std::make_shared<SlotLease>(pool_, *slot);
    const std::string id = NextId();
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    if (!parsed->stream) {
      Result<CompletionResult> out =
          engine_->Complete(lease->slot(), *parsed, [this](const std::string&) { return !stopping_.load(); });
      if (!out.ok()) return EngineError(res, out.status());
      metrics_.Completed(out->timings);
      return Reply(res, 200, CompletionResponse(*parsed, id, created, *out));
    }
    // Streaming: generation runs as the body is written, on this
    // connection's thread, holding the slot until the last event is sent.
    auto request = std::make_shared<CompletionRequest>(std::move(*parsed));
    metrics_.Count(200);
    res.content_type = "text/event-stream";
    res.stream = [this, lease, request, id, created](const std::function<bool(std::string_view)>& write) {
      auto send = [&](const std::string& s) { return !stopping_.load() && write(s); };
      Result<CompletionResult> out = engine_->Complete(lease->slot(), *request, [&](const std::string& piece) {
        return send(StreamEvent(*request, id, created, piece, "", nullptr));
      });
      if (out.ok()) {
        metrics_.Completed(out->timings);
        send(StreamEvent(*request, id, created, "", out->finish_reason, &out->timings));
      } else {
        send("data: " + ErrorBody(static_cast<int>(EngineErrorCode(out.status())), out.status().message()) + "\n\n");
      }
      send(StreamDone());
    };
  }

  CompletionEngine* engine_;
  CompletionServerOptions options_;
  SlotPool pool_;
  ServerMetrics metrics_;
  std::unique_ptr<HttpServer> server_;
  std::mutex stop_mu_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace

Result<std::unique_ptr<CompletionServer>> CompletionServer::Start(CompletionEngine* engine,
                                                                  const CompletionServerOptions& options) {
  if (!engine || engine->slots() == 0) return Status::InvalidArgument("completion server needs an engine with slots");
  auto server = std::make_unique<ServerImpl>(engine, options);
  Status st = server->Bind();
  if (!st.ok()) return st;
  return std::unique_ptr<CompletionServer>(std::move(server));
}

}  // namespace cachegen::serve
