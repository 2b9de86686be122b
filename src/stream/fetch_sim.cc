// The streaming simulation's fetch (fetch_sim.h): FetchSession driven on a
// virtual clock.
#include "stream/fetch_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <random>

#include "stream/fetch_session.h"
#include "stream/link_clock.h"

namespace cachegen::sim {

namespace {

// The context's mean decode times with noise of relative spread `cv`.
DecodeTimes DecodeTimesWithSpread(const SimContext& context, double cv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 1.0);
  DecodeTimes times(context.chunks.size());
  for (size_t c = 0; c < context.chunks.size(); ++c) {
    times[c].resize(context.decode_s_per_token.size());
    for (size_t l = 0; l < times[c].size(); ++l) {
      const double factor = std::clamp(1 + cv * noise(rng), 0.2, 5.0);
      times[c][l] = context.decode_s_per_token[l] * context.chunks[c].tokens * factor;
    }
  }
  return times;
}

}  // namespace

DecodeTimes DrawDecodeTimes(const SimContext& context, uint64_t seed) {
  return DecodeTimesWithSpread(context, context.decode_cv, seed);
}

DecodeTimes MeanDecodeTimes(const SimContext& context) { return DecodeTimesWithSpread(context, 0, 0); }

double ContextKl(const SimContext& context, const std::vector<int>& levels) {
  double weighted = 0, tokens = 0;
  for (size_t c = 0; c < context.chunks.size() && c < levels.size(); ++c) {
    const double t = context.chunks[c].tokens;
    tokens += t;
    if (levels[c] >= 0 && levels[c] < context.levels()) weighted += t * context.level_kl[levels[c]];
  }
  return tokens > 0 ? weighted / tokens : 0;
}

double RecomputeSeconds(uint64_t tokens, double tokens_per_s) {
  if (tokens == 0) return 0;
  return tokens_per_s > 0 ? static_cast<double>(tokens) / tokens_per_s : std::numeric_limits<double>::infinity();
}

namespace {

// FetchIo on a virtual clock: requests travel over a LinkQueue, starting a
// round trip after they are issued; the decoder runs one decode at a time
// for the trial's drawn time, one more waiting behind it.
class SimIo final : public FetchIo {
 public:
  SimIo(const SimContext& context, const SimLink& link, const DecodeTimes& decode)
      : context_(context), link_(link.trace, link.offset_s), rtt_s_(link.rtt_s), decode_(decode) {}

  double Now() const override { return now_; }
  uint64_t Issue(uint32_t chunk, int level) override {
    const uint32_t transfer = link_.Send(now_ + rtt_s_, context_.chunks[chunk].level_bytes[level]);
    requests_.push_back({chunk, level, transfer});
    clock_.Issue(now_);  // index = the request's
    return requests_.size();
  }
  void Cancel(uint64_t request) override {
    Request& r = requests_[request - 1];
    if (r.cancelled || r.reported) return;
    r.cancelled = true;
    link_.Cancel(r.transfer);
    FinishOnClock(request - 1, now_);
  }
  uint64_t Received(uint64_t request) const override { return link_.Received(requests_[request - 1].transfer); }
  uint64_t ReceivedTotal() const override { return link_.received_total(); }
  double BusySeconds() const override { return clock_.BusySeconds(now_); }
  void Forget(uint64_t) override {}

  bool DecoderHas(uint32_t chunk, bool from_backup) const override {
    auto is = [&](const Job& j) { return j.chunk == chunk && j.from_backup == from_backup; };
    return (running_ && is(*running_)) || (waiting_ && is(*waiting_)) ||
           std::any_of(finished_.begin(), finished_.end(), is);
  }
  bool DecoderFull() const override { return waiting_.has_value(); }
  bool DecoderIdle() const override { return !running_ && !waiting_ && finished_.empty(); }
  void UnsubmitAfter(uint32_t chunk) override {
    if (waiting_ && waiting_->chunk > chunk) waiting_.reset();
  }
  void Submit(uint32_t chunk, bool from_backup, uint64_t request) override {
    const Request& r = requests_[request - 1];
    const Job job{chunk, from_backup, decode_[chunk][r.level]};
    if (!running_) {
      running_ = job;
      running_end_ = now_ + job.seconds;
    } else {
      waiting_ = job;
    }
  }
  void Discard(uint32_t, bool) override {}
  void HandOver(uint32_t, bool, uint64_t, int) override {}

  // Moves the clock to t and reports what finished by then to the session:
  // requests in the order they finished, then decodes.
  void AdvanceTo(double t, FetchSession& session) {
    now_ = t;
    link_.AdvanceTo(t);
    std::vector<size_t> done;
    for (size_t i = 0; i < requests_.size(); ++i)
      if (!requests_[i].reported && !requests_[i].cancelled && link_.Done(requests_[i].transfer)) done.push_back(i);
    std::sort(done.begin(), done.end(),
              [&](size_t a, size_t b) { return link_.DoneAt(requests_[a].transfer) < link_.DoneAt(requests_[b].transfer); });
    for (size_t i : done) {
      requests_[i].reported = true;
      FinishOnClock(i, link_.DoneAt(requests_[i].transfer));
      session.OnArrived(i + 1, Status::Ok(), link_.Received(requests_[i].transfer));
    }
    while (running_ && running_end_ <= now_) {
      finished_.push_back(*running_);
      running_.reset();
      if (waiting_) {  // it starts the moment the running one ended
        running_ = waiting_;
        waiting_.reset();
        running_end_ += running_->seconds;
      }
    }
    while (!finished_.empty()) {
      const Job j = finished_.front();
      finished_.pop_front();
      session.OnDecoded(j.chunk, j.from_backup, Status::Ok(), DecodeCost{j.seconds, j.seconds, 0});
    }
  }
  // The next time something finishes on its own: a transfer or a decode.
  double NextEvent() const {
    return std::min(link_.NextDone(), running_ ? running_end_ : std::numeric_limits<double>::infinity());
  }

 private:
  struct Request {
    uint32_t chunk = 0;
    int level = 0;
    uint32_t transfer = 0;
    bool cancelled = false;
    bool reported = false;
  };
  // Request i ended at `at`: each of its packets is a progress report.
  void FinishOnClock(size_t i, double at) {
    const uint64_t received = link_.Received(requests_[i].transfer);
    const auto pieces = static_cast<unsigned>((received + LinkTrace::kPacketBytes - 1) / LinkTrace::kPacketBytes);
    clock_.Finish(i, at, link_.FirstByteAt(requests_[i].transfer), pieces);
  }
  struct Job {
    uint32_t chunk = 0;
    bool from_backup = false;
    double seconds = 0;
  };

  const SimContext& context_;
  LinkQueue link_;
  const double rtt_s_;
  const DecodeTimes& decode_;
  double now_ = 0;
  std::vector<Request> requests_;  // id = index + 1
  LinkClock clock_;
  std::optional<Job> running_, waiting_;
  double running_end_ = 0;
  std::deque<Job> finished_;
};

}  // namespace

SimOutcome SimulateFetch(const SimContext& context, const SimLink& link, const DecodeTimes& decode,
                         const StreamOptions& options, const std::vector<int>& static_levels) {
  SimIo io(context, link, decode);
  PlannerOptions popts = PlannerOptionsFor(options);
  popts.level_decode_s_per_token = context.decode_s_per_token;
  if (!context.decode_s_per_token.empty()) popts.decode_s_per_token = context.decode_s_per_token[0];
  popts.decode_cv = context.decode_cv;
  StreamOptions o = options;
  o.decode_threads = 1;
  FetchSession session(&io, context.chunks, o, popts, static_levels);
  // The client wakes when a request or a decode finishes, else every tick
  // (StreamClient::Fetch). A fetch that has not ended long after its
  // deadline is stopped: it missed it.
  constexpr double kTickS = 0.002;
  const double give_up_s = 100 * options.deadline_ms / 1000.0 + 10;
  int spins = 0;
  io.AdvanceTo(0, session);
  while (!session.done() && io.Now() < give_up_s) {
    if (session.Step() && ++spins < 10000) continue;
    spins = 0;
    const double next = std::min(io.NextEvent(), io.Now() + kTickS);
    io.AdvanceTo(std::max(next, io.Now()), session);
  }
  session.Finish(io.Now());
  const StreamResult& r = session.result();
  SimOutcome out;
  out.levels = r.levels;
  uint64_t recompute_tokens = 0;
  for (uint32_t c : r.recompute) recompute_tokens += context.chunks[c].tokens;
  out.total_s = session.done() ? io.Now() + RecomputeSeconds(recompute_tokens, options.recompute_tokens_per_s)
                               : std::numeric_limits<double>::infinity();
  out.met = out.total_s <= options.deadline_ms / 1000.0;
  out.kl = ContextKl(context, r.levels);
  int delivered = 0;
  double level_sum = 0;
  for (int l : r.levels)
    if (l >= 0) level_sum += l, ++delivered;
  out.level = delivered ? level_sum / delivered : 0;
  out.bytes = io.ReceivedTotal();
  out.recomputed = static_cast<uint32_t>(r.recompute.size());
  out.reissued = r.reissued;
  out.backups = r.backups;
  out.bandwidth_bytes_s = r.bandwidth_bytes_s;
  return out;
}

}  // namespace cachegen::sim
