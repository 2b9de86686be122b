#include "serve/completion_server.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/slot_pool.h"

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
    const uint32_t threads =
        options_.http_threads ? options_.http_threads : engine_->slots() + options_.max_waiting + 4;
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
    server_.set_payload_max_length(options_.limits.max_prompt_bytes);
    Routes();
    port_ = options_.port == 0 ? server_.bind_to_any_port(options_.host)
                               : (server_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
    if (port_ <= 0)
      return Status::IOError("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return Status::Ok();
  }

  int port() const override { return port_; }
  void Stop() override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    pool_.Close();
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Reply(httplib::Response& res, int status, const std::string& body, const char* type = "application/json") {
    res.status = status;
    res.set_content(body, type);
    metrics_.Count(status);
  }
  void Error(httplib::Response& res, int status, const std::string& message) {
    Reply(res, status, ErrorBody(status, message));
  }

  void Routes() {
    server_.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      Reply(res, 200, nlohmann::json({{"status", "ok"}, {"slots", engine_->slots()}, {"busy", pool_.busy()},
                                      {"waiting", pool_.waiting()}})
                          .dump());
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      Reply(res, 200, metrics_.Text() + engine_->MetricsText(), "text/plain; version=0.0.4");
    });
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json m = {{"id", engine_->model_name()}, {"object", "model"}, {"owned_by", "cachegen"}};
      Reply(res, 200, nlohmann::json({{"object", "list"}, {"data", {m}}}).dump());
    });
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res, false); });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res, true); });
    server_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) res.set_content(ErrorBody(res.status, "HTTP " + std::to_string(res.status)), "application/json");
    });
  }

  std::string NextId() { return "cmpl-cachegen-" + std::to_string(++next_id_); }

  void Handle(const httplib::Request& http_req, httplib::Response& res, bool chat) {
    Result<CompletionRequest> parsed = ParseCompletionRequest(http_req.body, chat, options_.limits);
    if (!parsed.ok()) return Error(res, 400, parsed.status().message());
    if (parsed->model.empty()) parsed->model = engine_->model_name();
    std::optional<uint32_t> slot = pool_.Acquire();
    if (!slot) return Error(res, 503, "server busy: every slot is in use and the queue is full");
    auto lease = std::make_shared<SlotLease>(pool_, *slot);
    const std::string id = NextId();
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    if (!parsed->stream) {
      Result<CompletionResult> out = engine_->Complete(lease->slot(), *parsed, [](const std::string&) { return true; });
      if (!out.ok())
        return Error(res, out.status().code() == StatusCode::kInvalidArgument ? 400 : 500, out.status().message());
      metrics_.Completed(out->timings);
      return Reply(res, 200, CompletionResponse(*parsed, id, created, *out));
    }
    // Streaming: generation runs inside the content provider, on this
    // connection's thread, holding the slot until the last event is sent.
    auto request = std::make_shared<CompletionRequest>(std::move(*parsed));
    metrics_.Count(200);
    res.set_chunked_content_provider(
        "text/event-stream", [this, lease, request, id, created](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) { return sink.is_writable() && sink.write(s.data(), s.size()); };
          Result<CompletionResult> out = engine_->Complete(lease->slot(), *request, [&](const std::string& piece) {
            return send(StreamEvent(*request, id, created, piece, "", nullptr));
          });
          if (out.ok()) {
            metrics_.Completed(out->timings);
            send(StreamEvent(*request, id, created, "", out->finish_reason, &out->timings));
          } else {
            send("data: " + ErrorBody(500, out.status().message()) + "\n\n");
          }
          send(StreamDone());
          sink.done();
          return true;
        });
  }

  CompletionEngine* engine_;
  CompletionServerOptions options_;
  SlotPool pool_;
  ServerMetrics metrics_;
  httplib::Server server_;
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;
  int port_ = -1;
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
