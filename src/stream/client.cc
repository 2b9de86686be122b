// StreamClient (include/cachegen/stream_client.h).
#include "cachegen/stream_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "stream/progress_get.h"

namespace cachegen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// One request: what the client and its fetch thread share.
struct Ticket {
  uint64_t id = 0;
  uint32_t chunk = 0;
  uint32_t level = 0;
  std::atomic<uint64_t> received{0};  // frame bytes arrived so far
  std::atomic<bool> cancel{false};    // abandon it (stores with progress only)
};

struct Done {
  std::shared_ptr<Ticket> ticket;
  Result<std::vector<uint8_t>> frame = Status::Internal("not fetched");
  Clock::time_point finished;
};

// Fetch workers: requests in, results out in the order they finished. It
// counts the bytes that arrived for every request (abandoned ones too: they
// used the link) and keeps the link's idle periods (nothing requested and
// unfinished), so that bandwidth is measured over busy time only.
class Fetcher {
 public:
  Fetcher(ChunkStore* store, std::span<const ChunkKey> keys, uint32_t threads)
      : store_(store), progress_(dynamic_cast<ProgressGetProvider*>(store)), keys_(keys) {
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Fetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (auto& t : jobs_) t->cancel = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  std::shared_ptr<Ticket> Issue(uint32_t chunk, uint32_t level) {
    auto t = std::make_shared<Ticket>();
    t->chunk = chunk;
    t->level = level;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t->id = ++last_id_;
      const Clock::time_point now = Clock::now();
      if (active_ == 0 && finished_any_) idle_.emplace_back(last_finish_, now);
      ++active_;
      jobs_.push_back(t);
    }
    cv_.notify_one();
    return t;
  }
  // The earliest finished request not yet taken, waiting up to `wait_s`.
  std::optional<Done> Next(double wait_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait_s > 0)
      done_cv_.wait_for(lock, std::chrono::duration<double>(wait_s), [this] { return !done_.empty(); });
    if (done_.empty()) return std::nullopt;
    Done r = std::move(done_.front());
    done_.pop_front();
    return r;
  }
  uint64_t received() const { return received_.load(); }
  // Seconds in [from, to] during which the link had work (requests issued
  // and not finished).
  double BusySeconds(Clock::time_point from, Clock::time_point to) {
    std::lock_guard<std::mutex> lock(mu_);
    double idle = 0;
    for (const auto& [a, b] : idle_) {
      const Clock::time_point lo = std::max(a, from), hi = std::min(b, to);
      if (hi > lo) idle += Seconds(lo, hi);
    }
    if (active_ == 0 && finished_any_ && to > std::max(last_finish_, from))
      idle += Seconds(std::max(last_finish_, from), to);
    return std::max(0.0, Seconds(from, to) - idle);
  }

 private:
  void Run() {
    for (;;) {
      std::shared_ptr<Ticket> t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        t = jobs_.front();
        jobs_.pop_front();
      }
      Done d;
      d.ticket = t;
      if (t->cancel) {
        d.frame = Status::IOError("cancelled");
      } else if (progress_) {
        uint64_t seen = 0;
        d.frame = progress_->GetWithProgress(keys_[t->chunk], t->level, [&](uint64_t received) {
          if (received < seen) seen = 0;  // the store retried on a new connection
          received_ += received - seen;
          seen = received;
          t->received = received;
          return !t->cancel.load();
        });
      } else {
        d.frame = store_->Get(keys_[t->chunk], t->level);
        if (d.frame.ok()) {
          received_ += d.frame->size();
          t->received = d.frame->size();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        d.finished = Clock::now();  // under the lock: done_ stays in finish order
        --active_;
        last_finish_ = std::max(last_finish_, d.finished);
        finished_any_ = true;
        done_.push_back(std::move(d));
      }
      done_cv_.notify_one();
    }
  }

  ChunkStore* store_;
  ProgressGetProvider* progress_;
  std::span<const ChunkKey> keys_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::shared_ptr<Ticket>> jobs_;
  std::deque<Done> done_;
  uint64_t last_id_ = 0;
  std::atomic<uint64_t> received_{0};
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
  if (options.read_ahead < 1) return Status::InvalidArgument("stream: read-ahead must be >= 1");
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
  popts.reserve = options.reserve;
  LevelPlanner planner(std::move(plan_chunks), popts);
  const bool adaptive = options.fixed_level < 0;

  // Twice the pipeline's threads: an abandoned request holds its thread until
  // its next bytes arrive, and must not delay the request that replaces it.
  Fetcher fetcher(store_, keys.first(n), 2 * options.inflight);
  std::vector<std::optional<Done>> ready(n);
  std::vector<bool> skipped(n, false);  // recompute chosen at issue time, or failed
  std::vector<int> issued_level(n, -1);
  std::vector<bool> reissued(n, false);
  std::vector<std::shared_ptr<Ticket>> flight;  // requests outstanding, in chunk order
  uint32_t next_issue = 0, next_deliver = 0;
  RateEstimator rate;
  Clock::time_point first_issue{};
  bool issued_any = false;

  auto fail = [&](uint32_t i, const std::string& why) {
    result.errors.push_back("chunk " + std::to_string(i) + " (" + keys[i].Hex() + "): " + why);
    skipped[i] = true;
  };
  auto frame_bytes = [&](uint32_t c, int level) { return found[c].level_bytes[level]; };
  auto send = [&](uint32_t c, int level) {
    if (!issued_any) first_issue = Clock::now();
    issued_any = true;
    issued_level[c] = level;
    return fetcher.Issue(c, static_cast<uint32_t>(level));
  };
  // The link's rate from the bytes arrived so far, then the planner's view of
  // the requests in flight.
  auto observe = [&] {
    if (!issued_any) return;
    rate.Observe(fetcher.BusySeconds(first_issue, Clock::now()), fetcher.received());
    planner.SetBandwidth(rate.rate());
    planner.SetLinkSpread(rate.spread());
  };
  auto in_flight = [&] {
    std::vector<InFlight> v;
    for (const auto& t : flight) v.push_back({t->chunk, static_cast<int>(t->level), t->received.load()});
    return v;
  };
  auto pending_decode = [&] {  // fetched, not yet decoded
    double s = 0;
    for (uint32_t c = next_deliver; c < next_issue; ++c)
      if (ready[c] && !skipped[c]) s += planner.DecodeSeconds(c, issued_level[c]);
    return s;
  };
  // Adaptive: abandon requests in flight that the deadline needs at a
  // coarser level, and request those chunks again.
  auto reissue = [&] {
    if (!adaptive || flight.empty() || planner.bandwidth() <= 0 || !rate.settled()) return;
    const Plan plan = planner.Replan(next_issue, Seconds(t0, Clock::now()), in_flight(), pending_decode());
    for (size_t i = 0; i < plan.reissue.size(); ++i) {
      std::shared_ptr<Ticket>& t = flight[i];
      // Once per chunk: a chunk already re-issued for a drop keeps its
      // second request (a chain of abandons would feed on its own waste).
      if (plan.reissue[i] < 0 || reissued[t->chunk]) continue;
      reissued[t->chunk] = true;
      t->cancel = true;
      ++result.reissued;
      result.abandoned_bytes += t->received.load();
      t = send(t->chunk, plan.reissue[i]);
    }
  };
  auto issue = [&] {  // while there is room; while the bandwidth is unknown, one probe
    while (next_issue < n && flight.size() < options.inflight && next_issue - next_deliver < options.read_ahead &&
           (!adaptive || planner.bandwidth() > 0 || flight.empty())) {
      int level;
      if (!adaptive) {
        level = planner.Resolve(next_issue, options.fixed_level);
      } else {
        // Beyond two requests, keep at most queue_ms of transfer outstanding.
        // Two: the second keeps the link busy while this thread decodes
        // between the first's completion and the next request (with one, a
        // slow link idles for a decode per chunk).
        uint64_t outstanding = 0;
        for (const auto& t : flight) {
          const uint64_t b = frame_bytes(t->chunk, static_cast<int>(t->level)), r = t->received.load();
          outstanding += b > r ? b - r : 0;
        }
        if (flight.size() >= 2 && static_cast<double>(outstanding) / planner.bandwidth() * 1000.0 >= options.queue_ms)
          break;
        const Plan plan = planner.Replan(next_issue, Seconds(t0, Clock::now()), in_flight(), pending_decode());
        level = plan.decisions[0].level;
      }
      if (level < 0) {
        skipped[next_issue] = true;
        ++next_issue;
        continue;
      }
      flight.push_back(send(next_issue, level));
      ++next_issue;
    }
  };
  auto complete = [&](Done d) {
    auto it = std::find(flight.begin(), flight.end(), d.ticket);
    if (it == flight.end()) return;  // abandoned and re-issued
    flight.erase(it);
    if (d.frame.ok()) result.bytes += d.frame->size();
    ready[d.ticket->chunk] = std::move(d);
  };
  // Decodes and hands over chunk next_deliver when it is there; false if not.
  auto deliver_one = [&]() -> bool {
    if (next_deliver >= n || next_deliver >= next_issue || !(skipped[next_deliver] || ready[next_deliver]))
      return false;
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
    chunk.level = d.ticket->level;
    chunk.token_start = info->token_start;
    chunk.bytes = d.frame->size();
    chunk.kv = &kv;
    if (on_chunk) on_chunk(chunk);
    planner.OnProcessed(Seconds(dec0, Clock::now()), static_cast<int>(d.ticket->level));
    result.levels[i] = static_cast<int>(d.ticket->level);
    return true;
  };

  // Between two decodes: take every finished fetch, measure, re-issue what
  // the deadline needs coarser, then refill the pipeline, so requests are
  // issued with the newest estimate and the link does not idle while chunks
  // are decoded. With nothing to decode, wait for a fetch a tick at a time
  // (the estimate follows the bytes arriving meanwhile).
  constexpr double kTickS = 0.002;
  while (next_deliver < n) {
    while (auto r = fetcher.Next(0)) complete(std::move(*r));
    observe();
    reissue();
    issue();
    if (deliver_one()) continue;
    if (flight.empty()) continue;  // everything left was skipped or is issuable
    if (auto r = fetcher.Next(kTickS)) complete(std::move(*r));
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
