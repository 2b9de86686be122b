// StreamClient (include/cachegen/stream_client.h).
#include "cachegen/stream_client.h"

#include <chrono>
#include <condition_variable>
#include <deque>
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

// Fetch workers: jobs in, results out in the order they finished. It also
// keeps the link's idle periods (nothing requested and unfinished), so that
// bandwidth is measured over busy time only.
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
      const Clock::time_point now = Clock::now();
      if (active_ == 0 && finished_any_) idle_.emplace_back(last_finish_, now);
      ++active_;
      jobs_.push_back({job, now});
    }
    cv_.notify_one();
  }
  // The earliest finished job not yet taken: blocks until there is one, or
  // returns nothing at once when `wait` is false and none is there.
  std::optional<std::pair<uint32_t, Done>> Next(bool wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) done_cv_.wait(lock, [this] { return !done_.empty(); });
    if (done_.empty()) return std::nullopt;
    std::pair<uint32_t, Done> r = std::move(done_.front());
    done_.pop_front();
    return r;
  }
  // Seconds in [from, to] during which the link had work (requests issued
  // and not finished).
  double BusySeconds(Clock::time_point from, Clock::time_point to) {
    std::lock_guard<std::mutex> lock(mu_);
    double idle = 0;
    for (const auto& [a, b] : idle_) {
      const Clock::time_point lo = std::max(a, from), hi = std::min(b, to);
      if (hi > lo) idle += Seconds(lo, hi);
    }
    return std::max(0.0, Seconds(from, to) - idle);
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
      {
        std::lock_guard<std::mutex> lock(mu_);
        d.finished = Clock::now();  // under the lock: done_ stays in finish order
        --active_;
        last_finish_ = std::max(last_finish_, d.finished);
        finished_any_ = true;
        done_.emplace_back(job.first.index, std::move(d));
      }
      done_cv_.notify_one();
    }
  }

  ChunkStore* store_;
  std::span<const ChunkKey> keys_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<Job, Clock::time_point>> jobs_;
  std::deque<std::pair<uint32_t, Done>> done_;
  uint32_t active_ = 0;
  bool finished_any_ = false;
  Clock::time_point last_finish_{};
  std::vector<std::pair<Clock::time_point, Clock::time_point>> idle_;
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
  std::vector<int> issued_level(n, -1);
  uint32_t next_issue = 0, next_deliver = 0, outstanding = 0;
  uint64_t outstanding_bytes = 0;
  // Bandwidth samples: the bytes of the last `inflight` completions (in
  // finish order) over the link's busy time since the completion before
  // them. With several requests sharing the link they progress together and
  // finish in bursts, so one gap between two completions says little; a
  // window as deep as the pipeline spans one "round" of it.
  std::deque<std::pair<Clock::time_point, uint64_t>> window;  // (finish, bytes) of the last completions
  Clock::time_point window_start{};                            // finish of the one before them, or first issue
  bool issued_any = false;

  auto fail = [&](uint32_t i, const std::string& why) {
    result.errors.push_back("chunk " + std::to_string(i) + " (" + keys[i].Hex() + "): " + why);
    skipped[i] = true;
  };
  auto issue = [&] {  // while there is room; while the bandwidth is unknown, one probe
    while (next_issue < n && outstanding < options.inflight &&
           (options.fixed_level >= 0 || planner.bandwidth() > 0 || outstanding == 0)) {
      int level;
      if (options.fixed_level >= 0) {
        level = planner.Resolve(next_issue, options.fixed_level);
      } else {
        // Beyond one request, keep at most queue_ms of transfer outstanding.
        if (outstanding > 0 && static_cast<double>(outstanding_bytes) / planner.bandwidth() * 1000.0 >= options.queue_ms)
          break;
        double pending_decode = 0;
        for (uint32_t c = next_deliver; c < next_issue; ++c)
          if (!skipped[c]) pending_decode += planner.DecodeSeconds(c, issued_level[c]);
        const Plan plan = planner.Replan(next_issue, Seconds(t0, Clock::now()), outstanding_bytes, pending_decode);
        level = plan.decisions[0].level;
      }
      if (level < 0) {
        skipped[next_issue] = true;
        ++next_issue;
        continue;
      }
      issued_bytes[next_issue] = found[next_issue].level_bytes[level];
      issued_level[next_issue] = level;
      outstanding_bytes += issued_bytes[next_issue];
      if (!issued_any) window_start = Clock::now();
      issued_any = true;
      fetcher.Issue({next_issue, static_cast<uint32_t>(level)});
      ++outstanding;
      ++next_issue;
    }
  };
  auto complete = [&](uint32_t i, Done d) {
    --outstanding;
    outstanding_bytes -= issued_bytes[i];
    if (d.frame.ok()) {
      result.bytes += d.frame->size();
      window.emplace_back(d.finished, d.frame->size());
      if (window.size() > options.inflight) {
        window_start = window.front().first;
        window.pop_front();
      }
      uint64_t bytes = 0;
      for (const auto& w : window) bytes += w.second;
      planner.OnDelivered(bytes, fetcher.BusySeconds(window_start, d.finished));
    }
    ready[i] = std::move(d);
  };
  // Decodes and hands over chunk next_deliver when it is there; false if not.
  auto deliver_one = [&]() -> bool {
    if (next_deliver >= n || !(skipped[next_deliver] || ready[next_deliver])) return false;
    const uint32_t i = next_deliver++;
    if (skipped[i]) return true;
    Done d = std::move(*ready[i]);
    ready[i].reset();
    if (!d.frame.ok()) {
      fail(i, d.frame.status().ToString());
      return true;
    }
    const Clock::time_point dec0 = Clock::now();
    Result<FrameInfo> info = InspectFrame(*d.frame);
    if (!info.ok()) {
      fail(i, info.status().ToString());
      return true;
    }
    KVTensor kv(info->shape, options.dtype);
    Status st = DecodeFrame(*d.frame, kv.view(), options.decode_threads);
    if (!st.ok()) {
      fail(i, st.ToString());
      return true;
    }
    result.decode_ms += Seconds(dec0, Clock::now()) * 1000.0;
    StreamedChunk chunk;
    chunk.index = i;
    chunk.level = d.level;
    chunk.token_start = info->token_start;
    chunk.bytes = d.frame->size();
    chunk.kv = &kv;
    if (on_chunk) on_chunk(chunk);
    planner.OnProcessed(Seconds(dec0, Clock::now()), static_cast<int>(d.level));
    result.levels[i] = static_cast<int>(d.level);
    return true;
  };

  // Between two decodes: take every finished fetch, then refill the pipeline,
  // so requests are issued with the newest estimate and the link does not
  // idle while chunks are decoded.
  while (next_deliver < n) {
    while (auto r = fetcher.Next(false)) complete(r->first, std::move(r->second));
    issue();
    if (deliver_one()) continue;
    if (outstanding == 0) continue;  // everything left was skipped or is issuable
    auto r = fetcher.Next(true);
    complete(r->first, std::move(r->second));
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
