// StreamClient (include/cachegen/stream_client.h).
#include "cachegen/stream_client.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
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
#include "stream/fetch_session.h"
#include "stream/link_clock.h"

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
  // Its fetch thread's: progress reports that brought bytes, and when the
  // first did (seconds on the fetcher's link clock).
  unsigned pieces = 0;
  double first_byte_s = -1;
  size_t link_request = 0;  // its index in the fetcher's LinkClock
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
      t->link_request = link_.Issue(Seconds(origin_, Clock::now()));
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
  // The link's busy time up to `to` (FetchIo::BusySeconds, LinkClock).
  double BusySeconds(Clock::time_point to) {
    std::lock_guard<std::mutex> lock(mu_);
    return link_.BusySeconds(Seconds(origin_, to));
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
      } else {
        uint64_t seen = 0;
        got = store_->GetWithProgress(keys_[t->chunk], t->level, [&](uint64_t received) {
          if (received < seen) seen = 0;  // the store retried on a new connection
          if (received > seen && ++t->pieces == 1) t->first_byte_s = Seconds(origin_, Clock::now());
          received_ += received - seen;
          seen = received;
          t->received = received;
          return !t->cancel.load();
        });
      }
      if (got.ok()) d.frame = FrameBytes(std::make_shared<const std::vector<uint8_t>>(std::move(*got)));
      else d.frame = got.status();
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_.erase(t);
        d.finished = Clock::now();  // under the lock: done_ stays in finish order
        link_.Finish(t->link_request, Seconds(origin_, d.finished), t->first_byte_s, t->pieces);
        done_.push_back(std::move(d));
      }
      done_cv_.notify_one();
    }
  }

  Fetcher(ChunkStore* store, std::span<const ChunkKey> keys)
      : store_(store), keys_(keys.begin(), keys.end()) {}

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  ChunkStore* store_;
  const std::vector<ChunkKey> keys_;  // a copy: the threads may outlive the fetch
  std::vector<Worker> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::set<std::shared_ptr<Ticket>> running_;  // requests in a store call now
  std::deque<std::shared_ptr<Ticket>> jobs_;
  std::deque<Done> done_;
  uint64_t last_id_ = 0;
  std::atomic<uint64_t> received_{0};
  const Clock::time_point origin_ = Clock::now();  // the link clock's zero
  LinkClock link_;
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

// The real driver of a FetchSession: requests go to the Fetcher's threads,
// decodes to the FetchDecoder, time is the steady clock since the fetch
// began. Keeps the frames that arrived (proved to be their chunk) and the
// decoded tensors until the session hands them over or lets them go.
class ClientIo final : public FetchIo {
 public:
  using TakeTensor = std::function<KVTensor(const KVShape&)>;
  using GiveTensor = std::function<void(KVTensor&&)>;
  ClientIo(Clock::time_point t0, std::span<const ChunkKey> keys, std::span<const uint32_t> chunk_tokens,
           const StreamOptions& options, Fetcher& fetcher, FetchDecoder& decoder, TakeTensor take, GiveTensor give,
           const ChunkCallback& on_chunk)
      : t0_(t0),
        keys_(keys),
        chunk_tokens_(chunk_tokens),
        options_(options),
        fetcher_(fetcher),
        decoder_(decoder),
        take_(std::move(take)),
        give_(std::move(give)),
        on_chunk_(on_chunk),
        chunk_start_(keys.size(), 0) {
    // Where chunk c starts in the context: the key chain starts at token 0.
    for (size_t i = 1; i < keys.size(); ++i) chunk_start_[i] = chunk_start_[i - 1] + chunk_tokens[i - 1];
  }
  ~ClientIo() override {
    for (auto& [key, t] : decoded_) give_(std::move(t.kv));
  }

  double Now() const override { return Seconds(t0_, Clock::now()); }
  uint64_t Issue(uint32_t chunk, int level) override {
    std::shared_ptr<Ticket> t = fetcher_.Issue(chunk, static_cast<uint32_t>(level));
    tickets_[t->id] = t;
    return t->id;
  }
  void Cancel(uint64_t request) override {
    if (auto it = tickets_.find(request); it != tickets_.end()) it->second->cancel = true;
  }
  uint64_t Received(uint64_t request) const override {
    auto it = tickets_.find(request);
    return it == tickets_.end() ? 0 : it->second->received.load();
  }
  uint64_t ReceivedTotal() const override { return fetcher_.received(); }
  double BusySeconds() const override { return fetcher_.BusySeconds(Clock::now()); }
  void Forget(uint64_t request) override { frames_.erase(request); }

  bool DecoderHas(uint32_t chunk, bool from_backup) const override { return decoder_.Has(chunk, from_backup); }
  bool DecoderFull() const override { return decoder_.full(); }
  bool DecoderIdle() const override { return decoder_.idle(); }
  void UnsubmitAfter(uint32_t chunk) override {
    if (std::optional<DecodeTask> back = decoder_.UnsubmitAfter(chunk)) give_(std::move(back->kv));
  }
  void Submit(uint32_t chunk, bool from_backup, uint64_t request) override {
    const Frame& f = frames_.at(request);
    decoder_.Submit(DecodeTask{chunk, from_backup, f.bytes, f.info.token_start, take_(f.info.shape)});
  }
  void Discard(uint32_t chunk, bool from_backup) override {
    auto it = decoded_.find({chunk, from_backup});
    if (it == decoded_.end()) return;
    give_(std::move(it->second.kv));
    decoded_.erase(it);
  }
  void HandOver(uint32_t chunk, bool from_backup, uint64_t request, int level) override {
    auto it = decoded_.find({chunk, from_backup});
    auto frame = frames_.find(request);
    if (it == decoded_.end() || frame == frames_.end()) return;
    StreamedChunk out;
    out.index = chunk;
    out.level = static_cast<uint32_t>(level);
    out.token_start = it->second.token_start;
    out.bytes = frame->second.bytes->size();
    out.kv = &it->second.kv;
    if (on_chunk_) on_chunk_(out);
    give_(std::move(it->second.kv));
    decoded_.erase(it);
    frames_.erase(frame);
  }

  // A finished fetch: its frame checked (FrameIsChunk), kept, and reported.
  void Arrive(Done d, FetchSession& session) {
    CheckFrame(d, session.result());
    const uint64_t id = d.ticket->id;
    if (!d.frame.ok()) {
      session.OnArrived(id, d.frame.status(), 0);
      return;
    }
    const uint64_t bytes = (*d.frame)->size();
    frames_[id] = Frame{std::move(*d.frame), std::move(d.info)};
    session.OnArrived(id, Status::Ok(), bytes);
  }
  // Every finished decode, kept and reported.
  void CollectDecodes(FetchSession& session) {
    while (std::optional<DecodeResult> r = decoder_.TakeFinished()) {
      if (!r->decoded.ok()) {
        session.OnDecoded(r->chunk, r->from_backup, r->decoded.status(), {});
        continue;
      }
      DecodedChunk& d = *r->decoded;
      const DecodeCost cost{d.wall_s(), d.cpu_s, d.arrived};
      if (auto old = decoded_.find({r->chunk, r->from_backup}); old != decoded_.end()) give_(std::move(old->second.kv));
      decoded_.insert_or_assign({r->chunk, r->from_backup}, std::move(d));
      session.OnDecoded(r->chunk, r->from_backup, Status::Ok(), cost);
    }
  }

 private:
  struct Frame {
    FrameBytes bytes;
    FrameInfo info;
  };
  // A frame arrived must prove it is chunk c at its level (FrameIsChunk);
  // one that does not is a miss, never data. The first frame taken fixes
  // what every other frame of the context must be coded like (with
  // options.shape, that shape from the start).
  void CheckFrame(Done& d, StreamResult& result) {
    if (!d.frame.ok()) return;
    const uint32_t c = d.ticket->chunk;
    Result<FrameInfo> info = FrameIsChunk(**d.frame, keys_[c], d.ticket->level, chunk_start_[c], chunk_tokens_[c]);
    if (info.ok() && info->shape.values() * DTypeSize(options_.dtype) > DecodeOutputLimit((*d.frame)->size()))
      info = Status::Corrupt("frame of " + std::to_string((*d.frame)->size()) + " bytes claims " +
                             info->shape.ToString() + ", over the decode limit (docs/FORMAT.md, \"Decode bound\")");
    if (info.ok()) {
      KVShape want = options_.shape;
      if (like_) want = like_->shape;
      want.tokens = info->shape.tokens;
      if (want.layers != 0 && !(info->shape == want))
        info = Status::Corrupt("frame shape " + info->shape.ToString() + ", the context's is " + want.ToString());
      else if (like_ && (info->codec != like_->codec || info->dtype != like_->dtype))
        info = Status::Corrupt("frame coded as " + info->codec + " from " + DTypeName(info->dtype) +
                               ", the context's frames as " + like_->codec + " from " + DTypeName(like_->dtype));
    }
    if (!info.ok()) {
      ++result.rejected;
      d.frame = info.status();
      return;
    }
    if (!like_) like_ = *info;
    d.info = std::move(info).value();
  }

  const Clock::time_point t0_;
  const std::span<const ChunkKey> keys_;
  const std::span<const uint32_t> chunk_tokens_;
  const StreamOptions& options_;
  Fetcher& fetcher_;
  FetchDecoder& decoder_;
  const TakeTensor take_;
  const GiveTensor give_;
  const ChunkCallback& on_chunk_;
  std::vector<uint32_t> chunk_start_;
  std::optional<FrameInfo> like_;
  std::map<uint64_t, std::shared_ptr<Ticket>> tickets_;
  std::map<uint64_t, Frame> frames_;
  std::map<std::pair<uint32_t, bool>, DecodedChunk> decoded_;  // (chunk, from_backup)
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
  double decode_cv = 0;  // LevelPlanner::DecodeCv of the latest fetch that measured it
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
  StreamResult lookup_result;
  lookup_result.requested = static_cast<uint32_t>(keys.size());

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
    lookup_result.lookup_ms = lookup_result.elapsed_ms = Seconds(t0, Clock::now()) * 1000.0;
    lookup_result.lookup_status =
        Status::IOError("lookup timed out: the store did not answer within the deadline (" +
                        std::to_string(static_cast<int64_t>(options.deadline_ms)) + " ms)");
    lookup_result.errors.push_back("lookup: " + lookup_result.lookup_status.ToString());
    lookup_result.timed_out = true;
    return lookup_result;
  }
  const std::vector<CachedChunk> found = std::move(lookup->found);
  const uint32_t n = static_cast<uint32_t>(found.size());

  std::vector<PlanChunk> plan_chunks(n);
  std::vector<std::string> names(n);
  for (uint32_t i = 0; i < n; ++i) {
    plan_chunks[i] = {chunk_tokens[i], found[i].level_bytes};
    names[i] = keys[i].Hex();
  }
  PlannerOptions popts = PlannerOptionsFor(options);
  {
    std::lock_guard<std::mutex> lock(costs_->mu);
    popts.receive_cost_s_per_byte = costs_->receive_cost_s_per_byte;
    popts.decode_s_per_token = costs_->decode_s_per_token;
    popts.level_decode_s_per_token = costs_->LevelDecodeSPerToken();
    popts.decode_cv = costs_->decode_cv;
  }

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
  // Tensors held at once: up to read_ahead decoded chunks waiting, the
  // chunk being handed over and the one being decoded.
  pool_->Expect(options.read_ahead + 2);
  TensorPool* pool = pool_.get();
  FetchDecoder decoder(options.decode_threads, options.profiles.get(), &fetcher);  // after `fetcher`: it wakes the fetcher's wait
  ClientIo io(t0, keys.first(n), chunk_tokens.first(n), options, fetcher, decoder,
              [pool, &options](const KVShape& shape) { return pool->Take(shape, options.dtype); },
              [pool](KVTensor&& t) { pool->Give(std::move(t)); }, on_chunk);
  FetchSession session(&io, std::move(plan_chunks), options, popts, {}, std::move(names));
  StreamResult& result = session.result();
  result.requested = lookup_result.requested;
  result.lookup_status = lookup->status;
  result.lookup_ms = Seconds(t0, Clock::now()) * 1000.0;
  if (!result.lookup_status.ok()) result.errors.push_back("lookup: " + result.lookup_status.ToString());

  // Report every finished fetch and decode, let the session decide; then
  // wait for a fetch or the decoder a tick at a time (the estimate follows
  // the bytes arriving meanwhile).
  constexpr double kTickS = 0.002;
  while (!session.done()) {
    if (options.cancel && options.cancel->load()) {
      result.errors.push_back("cancelled: " + std::to_string(n - session.delivered()) + " chunk(s) not delivered");
      break;
    }
    if (Clock::now() >= deadline) {
      result.errors.push_back("timed out: " + std::to_string(n - session.delivered()) +
                              " chunk(s) not delivered by the deadline (" +
                              std::to_string(static_cast<int64_t>(options.deadline_ms)) + " ms)");
      result.timed_out = true;
      break;
    }
    while (auto r = fetcher.Next(0)) io.Arrive(std::move(*r), session);
    io.CollectDecodes(session);
    if (session.Step()) continue;
    if (auto r = fetcher.Next(kTickS)) io.Arrive(std::move(*r), session);
  }
  session.Finish(Seconds(t0, Clock::now()));
  {
    std::lock_guard<std::mutex> lock(costs_->mu);
    const LevelPlanner& planner = session.planner();
    if (planner.receive_cost_measured()) costs_->receive_cost_s_per_byte = planner.ReceiveCost();
    if (planner.decode_spread_measured()) costs_->decode_cv = planner.DecodeCv();
    const auto& level_s = session.level_decoded_s();
    const auto& level_tokens = session.level_decoded_tokens();
    const double decoded_tokens = std::accumulate(level_tokens.begin(), level_tokens.end(), 0.0);
    if (decoded_tokens > 0)
      costs_->decode_s_per_token = std::accumulate(level_s.begin(), level_s.end(), 0.0) / decoded_tokens;
    costs_->AddFetch(level_s, level_tokens);
  }
  return std::move(result);
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
