// ChunkStore over the HTTP chunk service (ConnectService in include/cachegen/service.h).
#include <httplib.h>

#include <atomic>
#include <charconv>
#include <optional>
#include <nlohmann/json.hpp>

#include "cachegen/codec.h"
#include "cachegen/service.h"
#include "stream/lookup.h"
#include "stream/progress_get.h"

namespace cachegen {
namespace {

class HttpStore final : public ChunkStore, public PrefixLookupProvider, public ProgressGetProvider {
 public:
  HttpStore(std::string url, std::string host, int port, ClientOptions options)
      : url_(std::move(url)), host_(std::move(host)), port_(port), options_(std::move(options)) {}

  Status Put(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) override {
    auto res = Send([&](httplib::Client& c) {
      return c.Put(Path(key, level), Headers(), reinterpret_cast<const char*>(frame.data()), frame.size(),
                   "application/octet-stream");
    });
    if (!res) return NetError(res.error());
    if (res->status != 201 && res->status != 200 && res->status != 204) return HttpError(*res);
    puts_++;
    bytes_written_ += frame.size();
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> Get(const ChunkKey& key, uint32_t level) override {
    return GetWithProgress(key, level, nullptr);
  }

  Result<std::vector<uint8_t>> GetWithProgress(const ChunkKey& key, uint32_t level,
                                               const Progress& progress) override {
    // The body goes straight into the frame's buffer, sized from
    // Content-Length: received into a string and copied, a frame cost two
    // more copies of itself, and page faults on each fresh copy.
    bool abandoned = false;  // the caller's progress said stop
    bool oversized = false;  // more than max_frame_bytes
    int status = 0;
    std::vector<uint8_t> bytes;
    std::string error_body;  // the answer to a failed request, for its message
    auto on_response = [&](const httplib::Response& r) {
      status = r.status;
      bytes.clear();
      error_body.clear();
      if (status != 200) return true;
      const uint64_t length = HeaderNumber(r, "Content-Length").value_or(0);
      oversized = length > options_.max_frame_bytes;
      if (!oversized) bytes.reserve(length);
      return !oversized;
    };
    auto on_body = [&](const char* data, size_t n) {
      if (status != 200) {
        if (error_body.size() < kMaxErrorBody) error_body.append(data, std::min(n, kMaxErrorBody - error_body.size()));
        return true;
      }
      oversized = n > options_.max_frame_bytes - bytes.size();
      if (oversized) return false;
      bytes.insert(bytes.end(), reinterpret_cast<const uint8_t*>(data), reinterpret_cast<const uint8_t*>(data) + n);
      abandoned = progress && !progress(bytes.size());
      return !abandoned;
    };
    bool ended = false;  // abandoned or oversized: not sent again
    auto res = Send(
        [&](httplib::Client& c) {
          auto r = c.Get(Path(key, level), Headers(), on_response, on_body);
          ended = abandoned || oversized;
          return r;
        },
        &ended);
    if (!res) {
      if (abandoned) return Status::IOError("service " + url_ + ": cancelled");
      if (oversized) {
        misses_++;
        return Status::IOError("service " + url_ + ": chunk " + key.Hex() + "/" + std::to_string(level) +
                               " is larger than the client's limit of " + std::to_string(options_.max_frame_bytes) +
                               " bytes");
      }
      misses_++;
      return NetError(res.error());
    }
    if (res->status != 200) {
      misses_++;
      return HttpError(res->status, error_body);
    }
    Result<FrameInfo> info = InspectFrame(bytes);
    if (!info.ok() || info->level != level || info->bytes != bytes.size()) {
      misses_++;
      corrupt_++;
      return Status::NotFound("chunk " + key.Hex() + "/" + std::to_string(level) + " from " + url_ +
                              " failed verification");
    }
    hits_++;
    bytes_read_ += bytes.size();
    return bytes;
  }

  Result<uint64_t> Size(const ChunkKey& key, uint32_t level) override {
    auto res = Send([&](httplib::Client& c) { return c.Head(Path(key, level), Headers()); });
    if (!res) return NetError(res.error());
    if (res->status != 200) return HttpError(*res);
    const std::optional<uint64_t> n = HeaderNumber(*res, "X-Chunk-Bytes");
    if (!n) return Status::IOError("service " + url_ + ": HEAD without X-Chunk-Bytes");
    return *n;
  }

  Status Delete(const ChunkKey& key, uint32_t level) override {
    auto res = Send([&](httplib::Client& c) { return c.Delete(Path(key, level), Headers()); });
    if (!res) return NetError(res.error());
    if (res->status != 204 && res->status != 200 && res->status != 404) return HttpError(*res);
    return Status::Ok();
  }

  StoreStats stats() const override {
    StoreStats s;
    s.puts = puts_;
    s.hits = hits_;
    s.misses = misses_;
    s.corrupt = corrupt_;
    s.bytes_written = bytes_written_;
    s.bytes_read = bytes_read_;
    return s;
  }

  std::string uri() const override { return url_; }

  Result<std::vector<CachedChunk>> LookupPrefixBatch(std::span<const ChunkKey> keys, uint32_t levels) override {
    nlohmann::json req;
    nlohmann::json hex = nlohmann::json::array();
    for (const ChunkKey& k : keys) hex.push_back(k.Hex());
    req["keys"] = std::move(hex);
    req["levels"] = levels;
    const std::string body = req.dump();
    auto res = Send([&](httplib::Client& c) { return c.Post("/v1/lookup", Headers(), body, "application/json"); });
    if (!res) return NetError(res.error());
    if (res->status != 200) return HttpError(*res);
    nlohmann::json out = nlohmann::json::parse(res->body, nullptr, false);
    if (out.is_discarded() || !out.is_object() || !out.contains("chunks") || !out["chunks"].is_array())
      return Status::IOError("service " + url_ + ": malformed lookup answer");
    std::vector<CachedChunk> found;
    for (const auto& c : out["chunks"]) {
      if (found.size() >= keys.size() || !c.is_object() || !c.contains("key") || !c["key"].is_string() ||
          !c.contains("sizes") || !c["sizes"].is_array() || c["sizes"].size() > kMaxChunkLevels)
        return Status::IOError("service " + url_ + ": malformed lookup answer");
      Result<ChunkKey> key = ChunkKey::FromHex(c["key"].get<std::string>());
      if (!key.ok() || *key != keys[found.size()])
        return Status::IOError("service " + url_ + ": lookup answered other keys");
      CachedChunk chunk;
      chunk.key = *key;
      for (const auto& s : c["sizes"]) {
        if (!s.is_number_unsigned()) return Status::IOError("service " + url_ + ": malformed lookup answer");
        chunk.level_bytes.push_back(s.get<uint64_t>());
      }
      found.push_back(std::move(chunk));
    }
    return found;
  }

 private:
  static std::string Path(const ChunkKey& key, uint32_t level) {
    return "/v1/chunks/" + key.Hex() + "/" + std::to_string(level);
  }

  httplib::Headers Headers() const {
    httplib::Headers h;
    if (!options_.token.empty()) h.emplace("Authorization", "Bearer " + options_.token);
    return h;
  }

  // Runs one request on a pooled connection. Every request of this API is
  // idempotent (PUT stores the same bytes again, lookup only reads), so one
  // that failed in transport, with no answer (a kept-alive connection the
  // server had closed, a connection lost while the server's accept queue was
  // full), is sent once more on a new connection; one the caller ended
  // itself (*ended set by its callbacks: abandoned, or refused) is not.
  template <typename F>
  httplib::Result Send(const F& request, const bool* ended = nullptr) {
    auto c = Take();
    httplib::Result res = request(*c);
    if (!res && res.error() != httplib::Error::Connection && res.error() != httplib::Error::ConnectionTimeout &&
        !(ended && *ended)) {
      c = Take(/*fresh=*/true);
      res = request(*c);
    }
    Give(std::move(c), res);
    return res;
  }

  // A keep-alive connection from the pool (or a new one).
  std::unique_ptr<httplib::Client> Take(bool fresh = false) {
    if (!fresh) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pool_.empty()) {
        auto c = std::move(pool_.back());
        pool_.pop_back();
        return c;
      }
    }
    auto c = std::make_unique<httplib::Client>(host_, port_);
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    c->set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
    c->set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
    c->set_write_timeout(std::chrono::milliseconds(options_.write_timeout_ms));
    return c;
  }
  // Returns a connection to the pool unless its request failed.
  void Give(std::unique_ptr<httplib::Client> c, const httplib::Result& res) {
    if (!res) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.size() < 64) pool_.push_back(std::move(c));
  }

  Status NetError(httplib::Error e) const {
    return Status::IOError("service " + url_ + ": " + httplib::to_string(e));
  }
  Status HttpError(const httplib::Response& r) const { return HttpError(r.status, r.body); }
  Status HttpError(int status, const std::string& answer) const {
    std::string msg = "service " + url_ + ": HTTP " + std::to_string(status);
    nlohmann::json body = nlohmann::json::parse(answer, nullptr, false);
    if (body.is_object() && body.contains("error") && body["error"].is_string())
      msg += ": " + body["error"].get<std::string>();
    if (status == 404) return Status::NotFound(msg);
    if (status >= 400 && status < 500) return Status::InvalidArgument(msg);
    return Status::IOError(msg);
  }
  // A header holding an unsigned number; nullopt when absent or malformed.
  static std::optional<uint64_t> HeaderNumber(const httplib::Response& r, const char* name) {
    const std::string v = r.get_header_value(name);
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
    return n;
  }
  static constexpr size_t kMaxErrorBody = 64 << 10;  // of an error answer, kept for its message

  std::string url_, host_;
  int port_;
  ClientOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> pool_;
  std::atomic<uint64_t> puts_{0}, hits_{0}, misses_{0}, corrupt_{0}, bytes_written_{0}, bytes_read_{0};
};

}  // namespace

Result<std::unique_ptr<ChunkStore>> ConnectService(const std::string& url, const ClientOptions& options) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    return Status::InvalidArgument("service URL '" + url + "' must start with http://");
  std::string rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || rest.find('/') != std::string::npos)
    return Status::InvalidArgument("service URL '" + url + "' must be http://HOST:PORT");
  const std::string host = rest.substr(0, colon), port_text = rest.substr(colon + 1);
  int port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || p != port_text.data() + port_text.size() || port <= 0 || port > 65535)
    return Status::InvalidArgument("service URL '" + url + "': bad port");
  return std::unique_ptr<ChunkStore>(std::make_unique<HttpStore>("http://" + rest, host, port, options));
}

}  // namespace cachegen
