// StreamClient (include/cachegen/stream_client.h).
#include "cachegen/stream_client.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace cachegen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Job {
  uint32_t index = 0;
  uint32_t level = 0;
};

struct Done {
  Result<std::vector<uint8_t>> frame = Status::Internal("not fetched");
  uint32_t level = 0;
  Clock::time_point issued, finished;
};

// Fetch workers: jobs in, results out, in any order.
class Fetcher {
 public:
  Fetcher(ChunkStore* store, std::span<const ChunkKey> keys, uint32_t threads) : store_(store), keys_(keys) {
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Fetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Issue(Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({job, Clock::now()});
    }
    cv_.notify_one();
  }
  // Blocks until some job completes; returns (index, result).
  std::pair<uint32_t, Done> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return !done_.empty(); });
    auto it = done_.begin();
    std::pair<uint32_t, Done> r(it->first, std::move(it->second));
    done_.erase(it);
    return r;
  }

 private:
  void Run() {
    for (;;) {
      std::pair<Job, Clock::time_point> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      Done d;
      d.level = job.first.level;
      d.issued = job.second;
      d.frame = store_->Get(keys_[job.first.index], job.first.level);
      d.finished = Clock::now();
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(job.first.index, std::move(d));
      }
      done_cv_.notify_one();
    }
  }

  ChunkStore* store_;
  std::span<const ChunkKey> keys_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<Job, Clock::time_point>> jobs_;
  std::multimap<uint32_t, Done> done_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

Result<StreamResult> StreamClient::Fetch(std::span<const ChunkKey> keys, std::span<const uint32_t> chunk_tokens,
                                         const StreamOptions& options, const ChunkCallback& on_chunk) const {
  if (chunk_tokens.size() != keys.size())
    return Status::InvalidArgument("stream: " + std::to_string(chunk_tokens.size()) + " chunk sizes for " +
                                   std::to_string(keys.size()) + " keys");
  if (options.inflight < 1) return Status::InvalidArgument("stream: inflight must be >= 1");
  if (!(options.deadline_ms > 0)) return Status::InvalidArgument("stream: deadline must be > 0");
  if (options.fixed_level >= static_cast<int>(kMaxChunkLevels))
    return Status::InvalidArgument("stream: fixed level must be < 8");
  const Clock::time_point t0 = Clock::now();
  StreamResult result;
  result.requested = static_cast<uint32_t>(keys.size());

  const std::vector<CachedChunk> found = LookupPrefix(*store_, keys, std::min(options.levels, kMaxChunkLevels));
  result.lookup_ms = Seconds(t0, Clock::now()) * 1000.0;
  const uint32_t n = static_cast<uint32_t>(found.size());
  result.cached = n;
  result.levels.assign(n, -1);

  std::vector<PlanChunk> plan_chunks(n);
  for (uint32_t i = 0; i < n; ++i) plan_chunks[i] = {chunk_tokens[i], found[i].level_bytes};
  PlannerOptions popts;
  popts.deadline_s = options.deadline_ms / 1000.0;
  popts.recompute_tokens_per_s = options.recompute_tokens_per_s;
  popts.initial_bandwidth_bytes_s = options.initial_bandwidth_bytes_s;
  popts.smoothing = options.smoothing;
  popts.safety = options.safety;
  LevelPlanner planner(std::move(plan_chunks), popts);

  Fetcher fetcher(store_, keys.first(n), options.inflight);
  std::vector<std::optional<Done>> ready(n);
  std::vector<bool> skipped(n, false);  // recompute chosen at issue time
  std::vector<uint64_t> issued_bytes(n, 0);
  uint32_t next_issue = 0, next_deliver = 0, outstanding = 0;
  uint64_t outstanding_bytes = 0;
  // Bandwidth samples span the last `inflight` completions: with several
  // requests sharing the link they finish close together, so the gap between
  // two completions alone overstates the rate.
  std::deque<std::pair<Clock::time_point, uint64_t>> window;  // (finish, bytes delivered up to it)
  Clock::time_point first_issue{};
  bool issued_any = false;
  uint64_t delivered_total = 0;

  auto fail = [&](uint32_t i, const std::string& why) {
    result.errors.push_back("chunk " + std::to_string(i) + " (" + keys[i].Hex() + "): " + why);
    skipped[i] = true;
  };

  while (next_deliver < n) {
    // Issue while there is room; while the bandwidth is unknown, one probe.
    while (next_issue < n && outstanding < options.inflight &&
           (options.fixed_level >= 0 || planner.bandwidth() > 0 || outstanding == 0)) {
      int level;
      if (options.fixed_level >= 0) {
        level = planner.Resolve(next_issue, options.fixed_level);
      } else {
        const Plan plan = planner.Replan(next_issue, Seconds(t0, Clock::now()), outstanding_bytes);
        level = plan.decisions[0].level;
      }
      if (level < 0) {
        skipped[next_issue] = true;
        ++next_issue;
        continue;
      }
      issued_bytes[next_issue] = found[next_issue].level_bytes[level];
      outstanding_bytes += issued_bytes[next_issue];
      if (!issued_any) first_issue = Clock::now();
      issued_any = true;
      fetcher.Issue({next_issue, static_cast<uint32_t>(level)});
      ++outstanding;
      ++next_issue;
    }
    // Deliver what is ready, in order.
    while (next_deliver < n && (skipped[next_deliver] || ready[next_deliver])) {
      const uint32_t i = next_deliver++;
      if (skipped[i]) continue;
      Done d = std::move(*ready[i]);
      ready[i].reset();
      if (!d.frame.ok()) {
        fail(i, d.frame.status().ToString());
        continue;
      }
      const Clock::time_point dec0 = Clock::now();
      Result<FrameInfo> info = InspectFrame(*d.frame);
      if (!info.ok()) {
        fail(i, info.status().ToString());
        continue;
      }
      KVTensor kv(info->shape, options.dtype);
      Status st = DecodeFrame(*d.frame, kv.view(), options.decode_threads);
      if (!st.ok()) {
        fail(i, st.ToString());
        continue;
      }
      result.decode_ms += Seconds(dec0, Clock::now()) * 1000.0;
      StreamedChunk chunk;
      chunk.index = i;
      chunk.level = d.level;
      chunk.token_start = info->token_start;
      chunk.bytes = d.frame->size();
      chunk.kv = &kv;
      if (on_chunk) on_chunk(chunk);
      planner.OnProcessed(Seconds(dec0, Clock::now()));
      result.levels[i] = static_cast<int>(d.level);
    }
    if (next_deliver >= n) break;
    if (outstanding == 0) continue;  // everything left was skipped or is issuable
    // Wait for a completion.
    auto [i, d] = fetcher.Next();
    --outstanding;
    outstanding_bytes -= issued_bytes[i];
    if (d.frame.ok()) {
      result.bytes += d.frame->size();
      delivered_total += d.frame->size();
      const Clock::time_point from = window.empty() ? first_issue : std::max(window.front().first, d.issued);
      const uint64_t base = window.empty() || from == d.issued ? delivered_total - d.frame->size() : window.front().second;
      planner.OnDelivered(delivered_total - base, Seconds(from, d.finished));
      window.emplace_back(d.finished, delivered_total);
      if (window.size() > options.inflight) window.pop_front();
    }
    ready[i] = std::move(d);
  }
  for (uint32_t i = 0; i < n; ++i)
    if (result.levels[i] < 0) result.recompute.push_back(i);
  result.elapsed_ms = Seconds(t0, Clock::now()) * 1000.0;
  result.deadline_met = result.elapsed_ms <= options.deadline_ms;
  result.bandwidth_bytes_s = planner.bandwidth();
  return result;
}

Result<StreamResult> StreamClient::FetchTokens(const ChunkKey& root, std::span<const TokenId> tokens,
                                               uint32_t chunk_size, const StreamOptions& options,
                                               const ChunkCallback& on_chunk) const {
  if (chunk_size == 0) return Status::InvalidArgument("stream: chunk size must be > 0");
  const std::vector<ChunkKey> keys = ChunkKeys(root, tokens, chunk_size);
  std::vector<uint32_t> sizes(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    sizes[i] = static_cast<uint32_t>(std::min<size_t>(chunk_size, tokens.size() - i * chunk_size));
  return Fetch(keys, sizes, options, on_chunk);
}

}  // namespace cachegen
