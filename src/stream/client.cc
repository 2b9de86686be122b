// StreamClient (include/cachegen/stream_client.h).
#include "cachegen/stream_client.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <deque>
#include <system_error>
#include <time.h>
#include <mutex>
#include <numeric>
#include <set>
#include <functional>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "common/parallel.h"
#include "stream/progress_get.h"

namespace cachegen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// CPU time the calling thread has run, in seconds.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One request: what the client and its fetch thread share.
struct Ticket {
  uint64_t id = 0;
  uint32_t chunk = 0;
  uint32_t level = 0;
  std::atomic<uint64_t> received{0};  // frame bytes arrived so far
  std::atomic<bool> cancel{false};    // abandon it (stores with progress only)
};

// A fetched frame, shared: a decode on the decoder thread reads it while
// the client may let go of its copy (a backup whose planned frame came).
using FrameBytes = std::shared_ptr<const std::vector<uint8_t>>;

struct Done {
  std::shared_ptr<Ticket> ticket;
  Result<FrameBytes> frame = Status::Internal("not fetched");
  FrameInfo info;  // of `frame`, once the fetch took it (FrameIsChunk)
  Clock::time_point finished;
};

}  // namespace

// Threads of fetches that returned while a store call of theirs was still
// under way (a stalled store, at the deadline): they end when the call
// does, and the client joins them (the store outlives the client), at the
// latest in its destructor.
struct FetchStragglers {
  struct Thread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  ~FetchStragglers() {
    for (Thread& t : threads) t.thread.join();
  }
  void Add(std::thread thread, std::shared_ptr<std::atomic<bool>> done) {
    std::lock_guard<std::mutex> lock(mu);
    threads.push_back({std::move(thread), std::move(done)});
  }
  // Joins the threads that have ended.
  void Reap() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = threads.begin(); it != threads.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = threads.erase(it);
    }
  }
  std::mutex mu;
  std::vector<Thread> threads;
};

namespace {

// Runs `call` on a thread of its own and waits for it until `deadline`:
// true when it ended. If not, the thread goes on to `stragglers` and
// `call` must keep what it uses alive itself.
bool RunUntil(const std::function<void()>& call, Clock::time_point deadline, FetchStragglers& stragglers) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool ended = false;
  };
  auto wait = std::make_shared<Wait>();
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([wait, done, call] {
    call();
    {
      std::lock_guard<std::mutex> lock(wait->mu);
      wait->ended = true;
    }
    wait->cv.notify_all();
    *done = true;
  });
  std::unique_lock<std::mutex> lock(wait->mu);
  if (wait->cv.wait_until(lock, deadline, [&] { return wait->ended; })) {
    lock.unlock();
    t.join();
    return true;
  }
  stragglers.Add(std::move(t), std::move(done));
  return false;
}

// Fetch workers: requests in, results out in the order they finished. It
// counts the bytes that arrived for every request (abandoned ones too: they
// used the link) and keeps the link's idle periods (nothing requested and
// unfinished), so that bandwidth is measured over busy time only.
// Shared with its threads (Create): a fetch that returns while a store call
// is under way (a stalled store) hands its threads to the client's
// stragglers (Release), and the fetcher lives until the last one ends.
class Fetcher {
 public:
  static std::shared_ptr<Fetcher> Create(ChunkStore* store, std::span<const ChunkKey> keys, uint32_t threads) {
    auto f = std::shared_ptr<Fetcher>(new Fetcher(store, keys));
    for (uint32_t i = 0; i < threads; ++i) {
      auto done = std::make_shared<std::atomic<bool>>(false);
      f->threads_.push_back({std::thread([f, done] {
                               f->Run();
                               *done = true;
                             }),
                             done});
    }
    return f;
  }
  // Stops the threads: requests not started are dropped, those under way
  // are abandoned where the store allows it; the threads go to `stragglers`.
  void Release(FetchStragglers& stragglers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (auto& t : jobs_) t->cancel = true;
      for (auto& t : running_) t->cancel = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) stragglers.Add(std::move(t.thread), std::move(t.done));
    threads_.clear();
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
  // The earliest finished request not yet taken, waiting up to `wait_s`
  // (less after a Wake).
  std::optional<Done> Next(double wait_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait_s > 0)
      done_cv_.wait_for(lock, std::chrono::duration<double>(wait_s), [this] { return !done_.empty() || woken_; });
    woken_ = false;
    if (done_.empty()) return std::nullopt;
    Done r = std::move(done_.front());
    done_.pop_front();
    return r;
  }
  // Ends the current (or next) wait of Next: something else is ready.
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    done_cv_.notify_one();
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
        running_.insert(t);  // under the same lock: Release cancels it from here on
      }
      Done d;
      d.ticket = t;
      Result<std::vector<uint8_t>> got = Status::IOError("cancelled");
      if (t->cancel) {
        // not sent
      } else if (progress_) {
        uint64_t seen = 0;
        got = progress_->GetWithProgress(keys_[t->chunk], t->level, [&](uint64_t received) {
          if (received < seen) seen = 0;  // the store retried on a new connection
          received_ += received - seen;
          seen = received;
          t->received = received;
          return !t->cancel.load();
        });
      } else {
        got = store_->Get(keys_[t->chunk], t->level);
        if (got.ok()) {
          received_ += got->size();
          t->received = got->size();
        }
      }
      if (got.ok()) d.frame = FrameBytes(std::make_shared<const std::vector<uint8_t>>(std::move(*got)));
      else d.frame = got.status();
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_.erase(t);
        d.finished = Clock::now();  // under the lock: done_ stays in finish order
        --active_;
        last_finish_ = std::max(last_finish_, d.finished);
        finished_any_ = true;
        done_.push_back(std::move(d));
      }
      done_cv_.notify_one();
    }
  }

  Fetcher(ChunkStore* store, std::span<const ChunkKey> keys)
      : store_(store), progress_(dynamic_cast<ProgressGetProvider*>(store)), keys_(keys.begin(), keys.end()) {}

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  ChunkStore* store_;
  ProgressGetProvider* progress_;
  const std::vector<ChunkKey> keys_;  // a copy: the threads may outlive the fetch
  std::vector<Worker> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::set<std::shared_ptr<Ticket>> running_;  // requests in a store call now
  std::deque<std::shared_ptr<Ticket>> jobs_;
  std::deque<Done> done_;
  uint64_t last_id_ = 0;
  std::atomic<uint64_t> received_{0};
  uint32_t active_ = 0;
  bool finished_any_ = false;
  Clock::time_point last_finish_{};
  std::vector<std::pair<Clock::time_point, Clock::time_point>> idle_;
  bool stop_ = false;
  bool woken_ = false;
};

// A frame decoded, waiting to be handed over in chunk order.
struct DecodedChunk {
  KVTensor kv;
  uint32_t token_start = 0;
  Clock::time_point started, finished;
  double cpu_s = 0;  // the decoding thread's CPU time (all of the decode's with one decode thread)
  uint64_t arrived = 0;  // bytes received meanwhile (every request's)
  double wall_s() const { return Seconds(started, finished); }
};

// A decode to run: chunk `chunk`'s frame (its backup's if from_backup)
// into `kv`.
struct DecodeTask {
  uint32_t chunk = 0;
  bool from_backup = false;
  FrameBytes frame;
  uint32_t token_start = 0;
  KVTensor kv;
};

struct DecodeResult {
  uint32_t chunk = 0;
  bool from_backup = false;
  Result<DecodedChunk> decoded = Status::Internal("not decoded");
};

// The fetch's decoder: a thread of its own, so that the client's loop
// (taking finished fetches, measuring, issuing requests) never waits for a
// decode (a request issued one decode late leaves the link idle, and where
// a decode's tensor is new memory its page faults can cost several
// decodes). One decode runs and one more may wait behind it, so the next
// starts as soon as one ends: when the loop had to collect each decode and
// start the next on a new thread, 0.3 ms passed between decodes on the
// 2-core VM, 5 ms over a 16-chunk fetch. Wakes the fetcher's wait whenever
// a decode ends.
class FetchDecoder {
 public:
  FetchDecoder(uint32_t threads, const ProfileSet* profiles, Fetcher* fetcher)
      : threads_(threads), profiles_(profiles), fetcher_(fetcher) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error&) {
      // no thread to be had: Submit decodes on the caller's
    }
  }
  ~FetchDecoder() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  FetchDecoder(const FetchDecoder&) = delete;
  FetchDecoder& operator=(const FetchDecoder&) = delete;

  // Whether chunk c waits to be decoded, is being decoded or was decoded
  // and not taken yet, from its backup or not.
  bool Has(uint32_t c, bool from_backup) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ == std::make_pair(c, from_backup)) return true;
    if (waiting_ && waiting_->chunk == c && waiting_->from_backup == from_backup) return true;
    return std::any_of(finished_.begin(), finished_.end(),
                       [&](const DecodeResult& r) { return r.chunk == c && r.from_backup == from_backup; });
  }
  // No room for another task: one waits already.
  bool full() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_.has_value();
  }
  // Nothing running, waiting, or finished and not taken.
  bool idle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !running_ && !waiting_ && finished_.empty();
  }
  // The task waiting, taken back before it started, if it is for a chunk
  // after `c` (whose frame came, and goes first).
  std::optional<DecodeTask> UnsubmitAfter(uint32_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!waiting_ || waiting_->chunk <= c) return std::nullopt;
    std::optional<DecodeTask> t = std::move(waiting_);
    waiting_.reset();
    return t;
  }
  // Requires !full().
  void Submit(DecodeTask task) {
    if (!thread_.joinable()) {
      DecodeResult r = Decode(std::move(task));
      std::lock_guard<std::mutex> lock(mu_);
      finished_.push_back(std::move(r));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_ = std::move(task);
    }
    cv_.notify_one();
  }
  std::optional<DecodeResult> TakeFinished() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_.empty()) return std::nullopt;
    DecodeResult r = std::move(finished_.front());
    finished_.pop_front();
    return r;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || waiting_.has_value(); });
      if (stop_) return;
      DecodeTask task = std::move(*waiting_);
      waiting_.reset();
      running_ = std::make_pair(task.chunk, task.from_backup);
      lock.unlock();
      DecodeResult r = Decode(std::move(task));
      lock.lock();
      running_.reset();
      finished_.push_back(std::move(r));
      lock.unlock();
      fetcher_->Wake();
      lock.lock();
    }
  }
  DecodeResult Decode(DecodeTask task) const {
    const Clock::time_point t0 = Clock::now();
    const double cpu0 = ThreadCpuSeconds();
    const uint64_t received0 = fetcher_->received();
    DecodeResult r{task.chunk, task.from_backup};
    Status st = DecodeFrame(*task.frame, task.kv.view(), threads_, profiles_);
    if (st.ok())
      r.decoded = DecodedChunk{std::move(task.kv), task.token_start, t0, Clock::now(), ThreadCpuSeconds() - cpu0,
                               fetcher_->received() - received0};
    else
      r.decoded = std::move(st);
    return r;
  }

  const uint32_t threads_;
  const ProfileSet* profiles_;
  Fetcher* const fetcher_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<DecodeTask> waiting_;
  std::optional<std::pair<uint32_t, bool>> running_;  // chunk, from_backup
  std::deque<DecodeResult> finished_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace

// Tensors of handed-over chunks (and of early decodes not used), for the
// next decodes (StreamClient's contract): memory already written, so its
// pages need not fault in again. It keeps as many as a fetch can hold at
// once (the largest bound of the fetches so far), so that a steady sequence
// of fetches allocates none: keeping 4 while a fetch held up to 10, fetches
// at 10 Gbit/s on the 2-core VM still decoded a few chunks into new memory
// (25-35 ms each against 3.5).
struct StreamClient::TensorPool {
  KVTensor Take(const KVShape& shape, DType dtype) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = spare.begin(); it != spare.end(); ++it) {
        if (it->shape() != shape || it->dtype() != dtype) continue;
        KVTensor t = std::move(*it);
        spare.erase(it);
        return t;
      }
    }
    return KVTensor::Unfilled(shape, dtype);  // DecodeFrame writes every byte
  }
  void Give(KVTensor&& t) {
    std::lock_guard<std::mutex> lock(mu);
    if (spare.size() >= keep) spare.erase(spare.begin());  // the oldest: a shape seen less lately
    spare.push_back(std::move(t));
  }
  // A fetch holds up to `held` tensors at once.
  void Expect(size_t held) {
    std::lock_guard<std::mutex> lock(mu);
    keep = std::max(keep, held);
  }
  std::mutex mu;
  size_t keep = 0;
  std::vector<KVTensor> spare;
};

// What the latest fetches measured of this machine: the decoder's time lost
// per byte received (LevelPlanner::ReceiveCost) and its decode time per
// token, so that a fetch plans with them from its first requests (before,
// the first requests of a fetch at 10 Gbit/s on the 2-core VM were planned
// with decodes that cost nothing: all at the finest level, which a deadline
// a few ms above the decode time could not afford). Per level too: decode
// seconds and tokens summed over fetches, each fetch's sums halved at the
// next one, so a level decoded 16 times in one fetch is not outweighed by
// one decode in the next (PlannerOptions::level_decode_s_per_token).
struct StreamClient::MachineCosts {
  std::mutex mu;
  double receive_cost_s_per_byte = 0;
  double decode_s_per_token = 0;
  std::array<double, kMaxChunkLevels> level_decode_s{}, level_tokens{};

  void AddFetch(std::span<const double> decode_s, std::span<const double> tokens) {
    constexpr double kCarried = 0.5;
    for (size_t l = 0; l < level_tokens.size(); ++l) {
      level_decode_s[l] = kCarried * level_decode_s[l] + decode_s[l];
      level_tokens[l] = kCarried * level_tokens[l] + tokens[l];
    }
  }
  std::vector<double> LevelDecodeSPerToken() const {
    std::vector<double> out(level_tokens.size(), 0);
    for (size_t l = 0; l < out.size(); ++l)
      if (level_tokens[l] > 0) out[l] = level_decode_s[l] / level_tokens[l];
    return out;
  }
};

StreamClient::StreamClient(ChunkStore* store)
    : store_(store),
      pool_(std::make_unique<TensorPool>()),
      costs_(std::make_unique<MachineCosts>()),
      stragglers_(std::make_unique<FetchStragglers>()) {}
StreamClient::~StreamClient() = default;
StreamClient::StreamClient(StreamClient&&) noexcept = default;
StreamClient& StreamClient::operator=(StreamClient&&) noexcept = default;

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

  stragglers_->Reap();
  // The lookup too ends by the deadline, whatever the store does (a stalled
  // Redis answers each command only at its own timeout).
  const bool stop_at_deadline = options.stop_at_deadline && options.deadline_ms < 1e12;
  const Clock::time_point deadline =
      stop_at_deadline ? t0 + std::chrono::microseconds(static_cast<int64_t>(options.deadline_ms * 1000.0))
                       : Clock::time_point::max();
  struct LookupCall {
    std::vector<ChunkKey> keys;
    std::vector<CachedChunk> found;
    Status status;
  };
  auto lookup = std::make_shared<LookupCall>();
  lookup->keys.assign(keys.begin(), keys.end());
  const uint32_t lookup_levels = std::min(options.levels, kMaxChunkLevels);
  ChunkStore* store = store_;
  const auto run_lookup = [lookup, store, lookup_levels] {
    lookup->found = LookupPrefix(*store, lookup->keys, lookup_levels, &lookup->status);
  };
  if (!stop_at_deadline) {
    run_lookup();
  } else if (!RunUntil(run_lookup, deadline, *stragglers_)) {
    result.lookup_ms = result.elapsed_ms = Seconds(t0, Clock::now()) * 1000.0;
    result.lookup_status =
        Status::IOError("lookup timed out: the store did not answer within the deadline (" +
                        std::to_string(static_cast<int64_t>(options.deadline_ms)) + " ms)");
    result.errors.push_back("lookup: " + result.lookup_status.ToString());
    result.timed_out = true;
    return result;
  }
  result.lookup_status = lookup->status;
  const std::vector<CachedChunk> found = std::move(lookup->found);
  result.lookup_ms = Seconds(t0, Clock::now()) * 1000.0;
  if (!result.lookup_status.ok()) result.errors.push_back("lookup: " + result.lookup_status.ToString());
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
  popts.measured_margins = options.measured_margins;
  popts.hedge = options.hedge;
  {
    std::lock_guard<std::mutex> lock(costs_->mu);
    popts.receive_cost_s_per_byte = costs_->receive_cost_s_per_byte;
    popts.decode_s_per_token = costs_->decode_s_per_token;
    popts.level_decode_s_per_token = costs_->LevelDecodeSPerToken();
  }
  LevelPlanner planner(std::move(plan_chunks), popts);
  const bool adaptive = options.fixed_level < 0;

  // Twice the pipeline's threads: an abandoned request holds its thread until
  // its next bytes arrive, and must not delay the request that replaces it.
  const std::shared_ptr<Fetcher> fetcher_owner = Fetcher::Create(store_, keys.first(n), 2 * options.inflight);
  Fetcher& fetcher = *fetcher_owner;
  // Whatever happens below, the fetcher's threads go to the stragglers when
  // the fetch returns (after the decoder, declared after this).
  struct ReleaseFetcher {
    Fetcher& fetcher;
    FetchStragglers& stragglers;
    ~ReleaseFetcher() { fetcher.Release(stragglers); }
  } release_fetcher{fetcher, *stragglers_};
  std::vector<std::optional<Done>> ready(n);
  std::vector<bool> skipped(n, false);  // recompute chosen at issue time, or failed
  std::vector<int> issued_level(n, -1);
  std::vector<uint32_t> tried(n, 0);  // levels requested, a bit each (untried_level)
  std::vector<bool> reissued(n, false);
  std::vector<std::shared_ptr<Ticket>> flight;  // requests outstanding, in chunk order
  // Backups (hedging, LevelPlanner): at most one per chunk, its coarsest
  // level, requested next to the planned requests while slack allows.
  std::vector<std::shared_ptr<Ticket>> backup(n);
  std::vector<std::optional<Done>> backup_ready(n);
  std::vector<bool> backup_open(n, false);    // requested, not finished
  std::vector<bool> backup_failed(n, false);  // finished without a frame, not cancelled
  std::vector<bool> backup_dropped(n, false); // cancelled: the planned frame came
  std::vector<bool> use_backup(n, false);     // chunk to be delivered from its backup
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
    if (!issued_any) first_issue = Clock::now();  // the estimator's origin (RateEstimator::Observe)
    issued_any = true;
    issued_level[c] = level;
    tried[c] |= 1u << level;
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
  // Every backup but failed ones: the planner counts them all against the
  // slack (dropped and finished ones with nothing more to come; a dropped
  // one's chunk has its planned frame, so the planner offers it no more).
  auto backups = [&] {
    std::vector<InFlight> v;
    for (uint32_t c = 0; c < n; ++c) {
      if (!backup[c] || backup_failed[c]) continue;
      const int level = static_cast<int>(backup[c]->level);
      const bool more = backup_open[c] && !backup_dropped[c];
      v.push_back({c, level, more ? backup[c]->received.load() : frame_bytes(c, level)});
    }
    return v;
  };
  // Tensors held at once: up to read_ahead decoded chunks waiting, the
  // chunk being handed over and the one being decoded.
  pool_->Expect(options.read_ahead + 2);
  auto take_tensor = [&](const KVShape& shape) { return pool_->Take(shape, options.dtype); };
  auto give_back = [&](KVTensor&& t) { pool_->Give(std::move(t)); };
  // Chunks decoded and not handed over yet, and whether from their backup.
  struct Ahead {
    bool from_backup = false;
    Result<DecodedChunk> decoded;
  };
  std::vector<std::optional<Ahead>> ahead(n);
  FetchDecoder decoder(options.decode_threads, options.profiles.get(), &fetcher);  // after `fetcher`: it wakes the fetcher's wait
  // Whether chunk c is decoded from the frame it will be handed over from:
  // its planned frame once that is here, else its backup.
  auto decoded_ahead = [&](uint32_t c) { return ahead[c] && ahead[c]->from_backup == !ready[c]; };
  // An early decode that will not be handed over: its tensor back to the pool.
  auto discard = [&](std::optional<Ahead>& a) {
    if (a && a->decoded.ok()) give_back(std::move(a->decoded->kv));
    a.reset();
  };
  auto pending_decode = [&] {  // fetched (or to come from a backup), not yet decoded
    double s = 0;
    for (uint32_t c = next_deliver; c < next_issue; ++c) {
      if (skipped[c] || decoded_ahead(c)) continue;
      if (ready[c]) s += planner.DecodeSeconds(c, issued_level[c]);
      else if (use_backup[c]) s += planner.DecodeSeconds(c, static_cast<int>(backup[c]->level));
    }
    return s;
  };
  auto open_backups = [&] {
    uint32_t k = 0;
    for (uint32_t c = next_deliver; c < n; ++c) k += backup_open[c];
    return k;
  };
  // A chunk whose planned frame arrived needs its backup no more.
  auto drop_backup = [&](uint32_t c) {
    if (!backup[c] || !backup_open[c] || backup_dropped[c]) return;
    backup_dropped[c] = true;
    backup[c]->cancel = true;
    result.abandoned_bytes += backup[c]->received.load();
  };
  auto has_backup = [&](uint32_t c, int level) {
    return backup[c] && !backup_failed[c] && !backup_dropped[c] && static_cast<int>(backup[c]->level) == level;
  };
  // Adaptive: abandon requests in flight that the deadline needs at a
  // coarser level, and request those chunks again.
  auto reissue = [&] {
    if (!adaptive || flight.empty() || planner.bandwidth() <= 0 || !rate.settled()) return;
    const Plan plan =
        planner.Replan(next_issue, Seconds(t0, Clock::now()), in_flight(), backups(), pending_decode());
    std::vector<size_t> to_backup;  // requests given up for their chunk's backup
    for (size_t i = 0; i < plan.reissue.size(); ++i) {
      std::shared_ptr<Ticket>& t = flight[i];
      // Once per chunk: a chunk already re-issued for a drop keeps its
      // second request (a chain of abandons would feed on its own waste).
      if (plan.reissue[i] < 0 || reissued[t->chunk]) continue;
      reissued[t->chunk] = true;
      t->cancel = true;
      ++result.reissued;
      result.abandoned_bytes += t->received.load();
      if (has_backup(t->chunk, plan.reissue[i])) {
        use_backup[t->chunk] = true;
        to_backup.push_back(i);
      } else {
        t = send(t->chunk, plan.reissue[i]);
      }
    }
    for (size_t k = to_backup.size(); k-- > 0;)
      flight.erase(flight.begin() + static_cast<std::ptrdiff_t>(to_backup[k]));
  };
  // Beyond two requests, at most queue_ms of transfer outstanding, and two
  // while the bandwidth is unknown. Two: the second keeps the link busy while
  // this thread decodes between the first's completion and the next request
  // (with one, a slow link idles for a decode per chunk). More share the
  // link and arrive together: at 1 Gbit/s four level-0 requests issued at
  // once delayed the first decode from about 8 ms to 31.
  auto queue_full = [&] {
    if (flight.size() + open_backups() < 2) return false;
    if (planner.bandwidth() <= 0) return true;
    uint64_t outstanding = 0;
    auto add = [&](const std::shared_ptr<Ticket>& t) {
      const uint64_t b = frame_bytes(t->chunk, static_cast<int>(t->level)), r = t->received.load();
      outstanding += b > r ? b - r : 0;
    };
    for (const auto& t : flight) add(t);
    for (uint32_t c = next_deliver; c < n; ++c)
      if (backup_open[c]) add(backup[c]);
    return static_cast<double>(outstanding) / planner.bandwidth() * 1000.0 >= options.queue_ms;
  };
  auto issue = [&] {  // while there is room; adaptive, while the bandwidth is unknown, one probe
    while (next_issue < n && flight.size() + open_backups() < options.inflight &&
           next_issue - next_deliver < options.read_ahead && (!adaptive || planner.bandwidth() > 0 || flight.empty())) {
      if (queue_full()) break;
      int level;
      int hedge = -1;
      if (!adaptive) {
        level = planner.Resolve(next_issue, options.fixed_level);
      } else {
        const Plan plan =
            planner.Replan(next_issue, Seconds(t0, Clock::now()), in_flight(), backups(), pending_decode());
        level = plan.decisions[0].level;
        // The latest chunk named first; next_issue is requested now anyway.
        for (uint32_t c : plan.hedge)
          if (c != next_issue) {
            hedge = static_cast<int>(c);
            break;
          }
      }
      if (level >= 0 && has_backup(next_issue, level)) {  // planned at its backup's level
        use_backup[next_issue] = true;
        ++next_issue;
        continue;
      }
      if (level < 0) {
        skipped[next_issue] = true;
        drop_backup(next_issue);
        ++next_issue;
        continue;
      }
      if (hedge >= 0) {
        const uint32_t c = static_cast<uint32_t>(hedge);
        backup[c] = fetcher.Issue(c, static_cast<uint32_t>(planner.Coarsest(c)));
        backup_open[c] = true;
        ++result.backups;
        continue;  // backups first (LevelPlanner, "Hedging"); the planned request next time round
      }
      flight.push_back(send(next_issue, level));
      ++next_issue;
    }
  };
  // Where chunk c starts in the context: the key chain starts at token 0.
  std::vector<uint32_t> chunk_start(n, 0);
  for (uint32_t i = 1; i < n; ++i) chunk_start[i] = chunk_start[i - 1] + chunk_tokens[i - 1];
  // The first frame taken fixes what every other frame of the context must
  // be coded like (with options.shape, that shape from the start).
  std::optional<FrameInfo> like;
  // A frame arrived must prove it is chunk c at `level` (FrameIsChunk);
  // one that does not is a miss, never data.
  auto check_frame = [&](Done& d) {
    if (!d.frame.ok()) return;
    const uint32_t c = d.ticket->chunk;
    Result<FrameInfo> info = FrameIsChunk(**d.frame, keys[c], d.ticket->level, chunk_start[c], chunk_tokens[c]);
    if (info.ok() && info->shape.values() * DTypeSize(options.dtype) > DecodeOutputLimit((*d.frame)->size()))
      info = Status::Corrupt("frame of " + std::to_string((*d.frame)->size()) + " bytes claims " +
                             info->shape.ToString() + ", over the decode limit (docs/FORMAT.md, \"Decode bound\")");
    if (info.ok()) {
      KVShape want = options.shape;
      if (like) want = like->shape;
      want.tokens = info->shape.tokens;
      if (want.layers != 0 && !(info->shape == want))
        info = Status::Corrupt("frame shape " + info->shape.ToString() + ", the context's is " + want.ToString());
      else if (like && (info->codec != like->codec || info->dtype != like->dtype))
        info = Status::Corrupt("frame coded as " + info->codec + " from " + DTypeName(info->dtype) +
                               ", the context's frames as " + like->codec + " from " + DTypeName(like->dtype));
    }
    if (!info.ok()) {
      ++result.rejected;
      d.frame = info.status();
      return;
    }
    if (!like) like = *info;
    d.info = std::move(info).value();
  };
  // Levels requested per chunk (a bit each), so that a chunk whose frame
  // failed is asked for at a stored level not tried yet: coarser first
  // (cheaper, and the plan's margin holds), then finer.
  auto untried_level = [&](uint32_t c, int failed) -> int {
    const int levels = static_cast<int>(found[c].level_bytes.size());
    for (int l = failed + 1; l < levels; ++l)
      if (found[c].level_bytes[l] > 0 && !(tried[c] >> l & 1)) return l;
    for (int l = failed - 1; l >= 0; --l)
      if (found[c].level_bytes[l] > 0 && !(tried[c] >> l & 1)) return l;
    return -1;
  };
  auto complete = [&](Done d) {
    // The probe's end gives the first estimate if no window has yet.
    if (issued_any && rate.rate() <= 0)
      rate.ObserveCompletion(fetcher.BusySeconds(first_issue, Clock::now()), fetcher.received());
    const uint32_t c = d.ticket->chunk;
    check_frame(d);
    if (d.ticket == backup[c]) {
      backup_open[c] = false;
      if (backup_dropped[c]) return;  // its bytes are counted as abandoned
      if (!d.frame.ok()) {
        backup_failed[c] = true;
        return;
      }
      result.bytes += (*d.frame)->size();
      if (ready[c] || next_deliver > c) return;  // not needed any more
      backup_ready[c] = std::move(d);
      return;
    }
    auto it = std::find(flight.begin(), flight.end(), d.ticket);
    if (it == flight.end()) return;  // abandoned and re-issued
    flight.erase(it);
    if (!d.frame.ok() && backup[c] && !backup_failed[c] && !backup_dropped[c]) {
      use_backup[c] = true;  // the backup stands in for a failed request
      return;
    }
    if (!d.frame.ok()) {
      if (const int other = untried_level(c, static_cast<int>(d.ticket->level)); other >= 0) {
        result.errors.push_back("chunk " + std::to_string(c) + " level " + std::to_string(d.ticket->level) + ": " +
                                d.frame.status().ToString() + "; trying level " + std::to_string(other));
        ++result.fallbacks;
        std::shared_ptr<Ticket> t = send(c, other);
        auto at = std::find_if(flight.begin(), flight.end(), [&](const auto& f) { return f->chunk > c; });
        flight.insert(at, std::move(t));  // flight stays in chunk order
        return;
      }
    }
    if (d.frame.ok()) {
      result.bytes += (*d.frame)->size();
      drop_backup(c);
      backup_ready[c].reset();
      if (ahead[c] && ahead[c]->from_backup) discard(ahead[c]);
    }
    ready[c] = std::move(d);
  };
  // The frame chunk c will be handed over from, if it is here and decodable:
  // its planned frame, else its backup where that stands in for it, or may
  // (the chunk not requested yet) once the link has fallen. Not before: on a
  // link that holds, the planned frames come, and those decodes' CPU
  // (measured on 2 cores at 1 Gbit/s, 9 backups per fetch) went with 1.6-3.4
  // coarser re-issues per fetch and mean level 0.69-0.94 where the client
  // decoding only chosen backups took level 0 and re-issued none.
  auto frame_to_decode = [&](uint32_t c) -> const Done* {
    if (skipped[c]) return nullptr;
    if (ready[c]) return ready[c]->frame.ok() ? &*ready[c] : nullptr;
    const bool may_stand_in = use_backup[c] || (c >= next_issue && rate.drops() > 0);
    if (backup_ready[c] && may_stand_in && backup_ready[c]->frame.ok()) return &*backup_ready[c];
    return nullptr;
  };
  // Decodes d, chunk c's frame_to_decode (its backup unless the planned
  // frame is here).
  auto start_decode = [&](uint32_t c, const Done* d) {
    const bool from_backup = !ready[c];
    discard(ahead[c]);  // decoded from the other frame: not what is handed over
    decoder.Submit(DecodeTask{c, from_backup, *d->frame, d->info.token_start, take_tensor(d->info.shape)});
  };
  // Keeps the decoder busy: chunk next_deliver once it is here, else the
  // earliest later chunk whose frame is here and will be handed over (its
  // planned frame, or its backup where that stands in for it), so that
  // chunks arrived early (backups of the latest chunks, above all) are not
  // all decoded after the last one to arrive. At most read_ahead decoded (or
  // decoding) chunks wait. A chunk earlier than the one waiting in the
  // decoder takes its place.
  auto decode_next = [&] {
    uint32_t waiting = 0;
    for (uint32_t c = next_deliver; c < n; ++c) {
      const Done* d = frame_to_decode(c);
      if (!d) continue;
      if (decoded_ahead(c) || decoder.Has(c, !ready[c])) {
        waiting += c > next_deliver;
        continue;
      }
      if (c > next_deliver && waiting >= options.read_ahead) return;
      if (std::optional<DecodeTask> back = decoder.UnsubmitAfter(c)) give_back(std::move(back->kv));
      if (decoder.full()) return;
      start_decode(c, d);
      waiting += c > next_deliver;
    }
  };
  // With one decode thread, a decode during which bytes arrived costs its
  // own CPU time, and the rest of its wall time was lost to receiving them
  // (LevelPlanner, "Receiving shares the CPU"); time lost while nothing
  // arrived (other work on the machine) stays in the decode's cost. With
  // more threads, their CPU time is not measured: wall times, no loss.
  const bool decoder_measured = ResolveThreads(options.decode_threads) == 1;
  auto decode_cost_s = [&](const DecodedChunk& d) {
    return decoder_measured && d.arrived > 0 ? d.cpu_s : d.wall_s();
  };
  // Per level, of the chunks handed over (MachineCosts).
  std::array<double, kMaxChunkLevels> level_decoded_s{}, level_decoded_tokens{};
  // Takes the finished decode, unless its chunk has since got the frame it
  // was not decoded from (a backup's, when the planned frame came).
  auto collect_decode = [&] {
    while (std::optional<DecodeResult> r = decoder.TakeFinished()) {
      const uint32_t c = r->chunk;
      std::optional<Ahead> a = Ahead{r->from_backup, std::move(r->decoded)};
      if (a->decoded.ok() && decoder_measured) {
        const DecodedChunk& d = *a->decoded;
        planner.OnDecoderLoss(d.wall_s(), d.cpu_s, d.arrived);
      }
      if (a->from_backup && ready[c]) discard(a);
      else ahead[c] = std::move(a);
    }
  };
  // Hands over chunk next_deliver once it is decoded (or failed, or is to
  // be recomputed); false if not yet.
  auto deliver_one = [&]() -> bool {
    if (next_deliver >= n || next_deliver >= next_issue) return false;
    const uint32_t c = next_deliver;
    const bool from_backup = !ready[c] && use_backup[c];
    if (!skipped[c] && !ready[c] && !(from_backup && (backup_ready[c] || backup_failed[c]))) return false;
    const Done* here = frame_to_decode(c);
    if (here && !decoded_ahead(c)) return false;  // decode_next decodes it
    const uint32_t i = next_deliver++;
    std::optional<Ahead> decoded = std::move(ahead[i]);
    ahead[i].reset();
    if (skipped[i]) return true;
    if (from_backup && !backup_ready[i]) {
      fail(i, "backup request failed");
      return true;
    }
    Done d = std::move(from_backup ? *backup_ready[i] : *ready[i]);
    ready[i].reset();
    backup_ready[i].reset();
    drop_backup(i);
    if (from_backup) ++result.from_backup;
    if (!d.frame.ok()) {
      fail(i, d.frame.status().ToString());
      return true;
    }
    if (!decoded->decoded.ok()) {
      fail(i, decoded->decoded.status().ToString());
      return true;
    }
    DecodedChunk& out = *decoded->decoded;
    const Clock::time_point handed0 = Clock::now();
    StreamedChunk chunk;
    chunk.index = i;
    chunk.level = d.ticket->level;
    chunk.token_start = out.token_start;
    chunk.bytes = (*d.frame)->size();
    chunk.kv = &out.kv;
    if (on_chunk) on_chunk(chunk);
    result.decode_ms += out.wall_s() * 1000.0;
    const double cost_s = decode_cost_s(out);
    planner.OnProcessed(cost_s + Seconds(handed0, Clock::now()), static_cast<int>(d.ticket->level), chunk_tokens[i]);
    if (d.ticket->level < kMaxChunkLevels) {
      level_decoded_s[d.ticket->level] += cost_s;
      level_decoded_tokens[d.ticket->level] += chunk_tokens[i];
    }
    result.levels[i] = static_cast<int>(d.ticket->level);
    give_back(std::move(out.kv));
    return true;
  };

  // Take every finished fetch and decode, measure, re-issue what the
  // deadline needs coarser, refill the pipeline (so requests are issued
  // with the newest estimate), hand over what is decoded and keep the
  // decoder busy; then wait for a fetch or the decoder a tick at a time (the
  // estimate follows the bytes arriving meanwhile).
  constexpr double kTickS = 0.002;
  while (next_deliver < n) {
    if (options.cancel && options.cancel->load()) {
      result.errors.push_back("cancelled: " + std::to_string(n - next_deliver) + " chunk(s) not delivered");
      break;
    }
    if (Clock::now() >= deadline) {
      result.errors.push_back("timed out: " + std::to_string(n - next_deliver) +
                              " chunk(s) not delivered by the deadline (" +
                              std::to_string(static_cast<int64_t>(options.deadline_ms)) + " ms)");
      result.timed_out = true;
      break;
    }
    while (auto r = fetcher.Next(0)) complete(std::move(*r));
    collect_decode();
    decode_next();  // first: the decoder idles until then
    observe();
    reissue();
    issue();
    if (deliver_one()) continue;
    decode_next();
    if (flight.empty() && open_backups() == 0 && decoder.idle()) continue;  // everything left is skipped or issuable
    if (auto r = fetcher.Next(kTickS)) complete(std::move(*r));
  }
  for (uint32_t i = 0; i < n; ++i)
    if (result.levels[i] < 0) result.recompute.push_back(i);
  result.elapsed_ms = Seconds(t0, Clock::now()) * 1000.0;
  result.deadline_met = !result.timed_out && result.elapsed_ms <= options.deadline_ms;
  result.bandwidth_bytes_s = planner.bandwidth();
  result.receive_cost_ns_per_byte = planner.ReceiveCost() * 1e9;
  {
    std::lock_guard<std::mutex> lock(costs_->mu);
    if (planner.receive_cost_measured()) costs_->receive_cost_s_per_byte = planner.ReceiveCost();
    const double decoded_tokens = std::accumulate(level_decoded_tokens.begin(), level_decoded_tokens.end(), 0.0);
    if (decoded_tokens > 0)
      costs_->decode_s_per_token =
          std::accumulate(level_decoded_s.begin(), level_decoded_s.end(), 0.0) / decoded_tokens;
    costs_->AddFetch(level_decoded_s, level_decoded_tokens);
  }
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
