// FetchSession (fetch_session.h).
#include "stream/fetch_session.h"

#include <algorithm>

#include "common/parallel.h"

namespace cachegen {

PlannerOptions PlannerOptionsFor(const StreamOptions& options) {
  PlannerOptions p;
  p.deadline_s = options.deadline_ms / 1000.0;
  p.recompute_tokens_per_s = options.recompute_tokens_per_s;
  p.initial_bandwidth_bytes_s = options.initial_bandwidth_bytes_s;
  p.smoothing = options.smoothing;
  p.safety = options.safety;
  p.reserve = options.reserve;
  p.measured_margins = options.measured_margins;
  p.hedge = options.hedge;
  return p;
}

FetchSession::FetchSession(FetchIo* io, std::vector<PlanChunk> chunks, const StreamOptions& options,
                           const PlannerOptions& planner_options, std::vector<int> static_levels,
                           std::vector<std::string> names)
    : io_(io),
      options_(options),
      static_levels_(std::move(static_levels)),
      names_(std::move(names)),
      adaptive_(options.fixed_level < 0 && static_levels_.empty()),
      decoder_measured_(ResolveThreads(options.decode_threads) == 1),
      planner_(std::move(chunks), planner_options),
      chunks_(planner_.size()) {
  result_.cached = static_cast<uint32_t>(chunks_.size());
  result_.levels.assign(chunks_.size(), -1);
}

FetchSession::Request FetchSession::Send(uint32_t c, int level) {
  issued_any_ = true;
  chunks_[c].issued_level = level;
  chunks_[c].tried |= 1u << level;
  return {io_->Issue(c, level), c, level};
}

void FetchSession::Fail(uint32_t c, const std::string& why) {
  const std::string name = c < names_.size() ? " (" + names_[c] + ")" : "";
  result_.errors.push_back("chunk " + std::to_string(c) + name + ": " + why);
  chunks_[c].skipped = true;
}

// The link's rate from the bytes arrived so far, then the planner's view of
// the requests in flight.
void FetchSession::Observe() {
  if (!issued_any_) return;
  rate_.Observe(io_->BusySeconds(), io_->ReceivedTotal());
  planner_.SetBandwidth(rate_.rate());
  planner_.SetLinkSpread(rate_.spread());
}

std::vector<InFlight> FetchSession::InFlightNow() const {
  std::vector<InFlight> v;
  for (const Request& r : flight_) v.push_back({r.chunk, r.level, io_->Received(r.id)});
  return v;
}

// Every backup but failed ones: the planner counts them all against the
// slack (dropped and finished ones with nothing more to come; a dropped
// one's chunk has its planned frame, so the planner offers it no more).
std::vector<InFlight> FetchSession::Backups() const {
  std::vector<InFlight> v;
  for (uint32_t c = 0; c < chunks_.size(); ++c) {
    const Chunk& k = chunks_[c];
    if (!k.backup || k.backup_failed) continue;
    const int level = k.backup->level;
    const bool more = k.backup_open && !k.backup_dropped;
    v.push_back({c, level, more ? io_->Received(k.backup->id) : planner_.chunk(c).level_bytes[level]});
  }
  return v;
}

// Decode time still ahead for chunks fetched (or to come from a backup)
// and not decoded yet, less what the running decode has done already: a
// decode-bound fetch always has one half done, and counting it whole cost
// a level on deadlines a few ms above the decode time.
double FetchSession::PendingDecode() const {
  double s = 0;
  bool running_seen = false;
  for (uint32_t c = next_deliver_; c < next_issue_; ++c) {
    const Chunk& k = chunks_[c];
    if (k.skipped || DecodedAhead(c)) continue;
    double chunk_s = 0;
    if (k.ready) chunk_s = planner_.DecodeSeconds(c, k.issued_level);
    else if (k.use_backup) chunk_s = planner_.DecodeSeconds(c, k.backup->level);
    // The earliest chunk in the decoder is (nearly always) the one running.
    if (!running_seen && decode_began_ >= 0 && io_->DecoderHas(c, !k.ready)) {
      running_seen = true;
      chunk_s -= std::min(chunk_s, io_->Now() - decode_began_);
    }
    s += chunk_s;
  }
  return s;
}

uint32_t FetchSession::OpenBackups() const {
  uint32_t n = 0;
  for (uint32_t c = next_deliver_; c < chunks_.size(); ++c) n += chunks_[c].backup_open;
  return n;
}

// A chunk whose planned frame arrived needs its backup no more.
void FetchSession::DropBackup(uint32_t c) {
  Chunk& k = chunks_[c];
  if (!k.backup || !k.backup_open || k.backup_dropped) return;
  k.backup_dropped = true;
  result_.abandoned_bytes += io_->Received(k.backup->id);
  io_->Cancel(k.backup->id);
}

bool FetchSession::HasBackup(uint32_t c, int level) const {
  const Chunk& k = chunks_[c];
  return k.backup && !k.backup_failed && !k.backup_dropped && k.backup->level == level;
}

// Whether chunk c is decoded from the frame it will be handed over from:
// its planned frame once that is here, else its backup.
bool FetchSession::DecodedAhead(uint32_t c) const {
  const Chunk& k = chunks_[c];
  return k.ahead && k.ahead->from_backup == !k.ready;
}

// An early decode that will not be handed over.
void FetchSession::Discard(uint32_t c) {
  std::optional<Decoded>& a = chunks_[c].ahead;
  if (a && a->status.ok()) io_->Discard(c, a->from_backup);
  a.reset();
}

// Adaptive: abandon requests in flight that the deadline needs at a coarser
// level, and request those chunks again.
void FetchSession::Reissue() {
  if (!adaptive_ || flight_.empty() || planner_.bandwidth() <= 0 || !rate_.settled()) return;
  const Plan plan = planner_.Replan(next_issue_, io_->Now(), InFlightNow(), Backups(), PendingDecode());
  std::vector<size_t> to_backup;  // requests given up for their chunk's backup
  for (size_t i = 0; i < plan.reissue.size(); ++i) {
    Request& r = flight_[i];
    Chunk& k = chunks_[r.chunk];
    // Once per chunk: a chunk already re-issued for a drop keeps its second
    // request (a chain of abandons would feed on its own waste).
    if (plan.reissue[i] < 0 || k.reissued) continue;
    k.reissued = true;
    ++result_.reissued;
    result_.abandoned_bytes += io_->Received(r.id);
    io_->Cancel(r.id);
    if (HasBackup(r.chunk, plan.reissue[i])) {
      k.use_backup = true;
      to_backup.push_back(i);
    } else {
      r = Send(r.chunk, plan.reissue[i]);
    }
  }
  for (size_t i = to_backup.size(); i-- > 0;) flight_.erase(flight_.begin() + static_cast<std::ptrdiff_t>(to_backup[i]));
}

// Beyond two requests, at most queue_ms of transfer outstanding, and two
// while the bandwidth is unknown. Two: the second keeps the link busy while
// the client decodes between the first's completion and the next request
// (with one, a slow link idles for a decode per chunk). More share the link
// and arrive together: at 1 Gbit/s four level-0 requests issued at once
// delayed the first decode from about 8 ms to 31.
bool FetchSession::QueueFull() const {
  if (flight_.size() + OpenBackups() < 2) return false;
  if (planner_.bandwidth() <= 0) return true;
  uint64_t outstanding = 0;
  auto add = [&](const Request& r) {
    const uint64_t b = planner_.chunk(r.chunk).level_bytes[r.level], got = io_->Received(r.id);
    outstanding += b > got ? b - got : 0;
  };
  for (const Request& r : flight_) add(r);
  for (uint32_t c = next_deliver_; c < chunks_.size(); ++c)
    if (chunks_[c].backup_open) add(*chunks_[c].backup);
  return static_cast<double>(outstanding) / planner_.bandwidth() * 1000.0 >= options_.queue_ms;
}

// Issues requests while there is room; adaptive, while the bandwidth is
// unknown, one probe.
void FetchSession::IssueRequests() {
  const uint32_t n = static_cast<uint32_t>(chunks_.size());
  while (next_issue_ < n && flight_.size() + OpenBackups() < options_.inflight &&
         next_issue_ - next_deliver_ < options_.read_ahead &&
         (!adaptive_ || planner_.bandwidth() > 0 || flight_.empty())) {
    if (QueueFull()) break;
    int level;
    int hedge = -1;
    if (!static_levels_.empty()) {
      level = static_levels_[next_issue_] < 0 ? -1 : planner_.Resolve(next_issue_, static_levels_[next_issue_]);
    } else if (!adaptive_) {
      level = planner_.Resolve(next_issue_, options_.fixed_level);
    } else {
      const Plan plan = planner_.Replan(next_issue_, io_->Now(), InFlightNow(), Backups(), PendingDecode());
      level = plan.decisions[0].level;
      // The latest chunk named first; next_issue_ is requested now anyway.
      for (uint32_t c : plan.hedge)
        if (c != next_issue_) {
          hedge = static_cast<int>(c);
          break;
        }
    }
    Chunk& k = chunks_[next_issue_];
    if (level >= 0 && HasBackup(next_issue_, level)) {  // planned at its backup's level
      k.use_backup = true;
      ++next_issue_;
      continue;
    }
    if (level < 0) {
      k.skipped = true;
      DropBackup(next_issue_);
      ++next_issue_;
      continue;
    }
    if (hedge >= 0) {
      const uint32_t c = static_cast<uint32_t>(hedge);
      const int coarsest = planner_.Coarsest(c);
      issued_any_ = true;
      chunks_[c].backup = Request{io_->Issue(c, coarsest), c, coarsest};
      chunks_[c].backup_open = true;
      ++result_.backups;
      continue;  // backups first (LevelPlanner, "Hedging"); the planned request next time round
    }
    flight_.push_back(Send(next_issue_, level));
    ++next_issue_;
  }
}

// A stored level of chunk c not requested yet, for a chunk whose frame
// failed: coarser first (cheaper, and the plan's margin holds), then finer.
int FetchSession::UntriedLevel(uint32_t c, int failed) const {
  const std::vector<uint64_t>& sizes = planner_.chunk(c).level_bytes;
  const int levels = static_cast<int>(sizes.size());
  for (int l = failed + 1; l < levels; ++l)
    if (sizes[l] > 0 && !(chunks_[c].tried >> l & 1)) return l;
  for (int l = failed - 1; l >= 0; --l)
    if (sizes[l] > 0 && !(chunks_[c].tried >> l & 1)) return l;
  return -1;
}

void FetchSession::OnArrived(uint64_t request, const Status& status, uint64_t bytes) {
  // The probe's end gives the first estimate if no window has yet.
  if (issued_any_ && rate_.rate() <= 0) rate_.ObserveCompletion(io_->BusySeconds(), io_->ReceivedTotal());
  auto in_flight = std::find_if(flight_.begin(), flight_.end(), [&](const Request& r) { return r.id == request; });
  uint32_t c = 0;
  bool is_backup = false;
  if (in_flight != flight_.end()) {
    c = in_flight->chunk;
  } else {
    auto it = std::find_if(chunks_.begin(), chunks_.end(),
                           [&](const Chunk& k) { return k.backup && k.backup->id == request; });
    if (it == chunks_.end()) {  // abandoned and re-issued
      io_->Forget(request);
      return;
    }
    c = static_cast<uint32_t>(it - chunks_.begin());
    is_backup = true;
  }
  Chunk& k = chunks_[c];
  if (is_backup) {
    Arrival a{*k.backup, status, bytes};
    k.backup_open = false;
    if (k.backup_dropped) {  // its bytes are counted as abandoned
      io_->Forget(request);
      return;
    }
    if (!a.ok()) {
      k.backup_failed = true;
      io_->Forget(request);
      return;
    }
    result_.bytes += bytes;
    if (k.ready || next_deliver_ > c) {  // not needed any more
      io_->Forget(request);
      return;
    }
    k.backup_ready = std::move(a);
    return;
  }
  Arrival a{*in_flight, status, bytes};
  flight_.erase(in_flight);
  if (!a.ok() && k.backup && !k.backup_failed && !k.backup_dropped) {
    k.use_backup = true;  // the backup stands in for a failed request
    io_->Forget(request);
    return;
  }
  if (!a.ok()) {
    if (const int other = UntriedLevel(c, a.request.level); other >= 0) {
      result_.errors.push_back("chunk " + std::to_string(c) + " level " + std::to_string(a.request.level) + ": " +
                               a.status.ToString() + "; trying level " + std::to_string(other));
      ++result_.fallbacks;
      io_->Forget(request);
      const Request r = Send(c, other);
      auto at = std::find_if(flight_.begin(), flight_.end(), [&](const Request& f) { return f.chunk > c; });
      flight_.insert(at, r);  // flight_ stays in chunk order
      return;
    }
  }
  if (a.ok()) {
    result_.bytes += bytes;
    DropBackup(c);
    if (k.backup_ready) io_->Forget(k.backup_ready->request.id);
    k.backup_ready.reset();
    if (k.ahead && k.ahead->from_backup) Discard(c);
  }
  k.ready = std::move(a);
}

// The frame chunk c will be handed over from, if it is here and decodable:
// its planned frame, else its backup where that stands in for it, or may
// (the chunk not requested yet) once the link has fallen. Not before: on a
// link that holds, the planned frames come, and those decodes' CPU
// (measured on 2 cores at 1 Gbit/s, 9 backups per fetch) went with 1.6-3.4
// coarser re-issues per fetch and mean level 0.69-0.94 where the client
// decoding only chosen backups took level 0 and re-issued none.
const FetchSession::Arrival* FetchSession::FrameToDecode(uint32_t c) const {
  const Chunk& k = chunks_[c];
  if (k.skipped) return nullptr;
  if (k.ready) return k.ready->ok() ? &*k.ready : nullptr;
  const bool may_stand_in = k.use_backup || (c >= next_issue_ && rate_.drops() > 0);
  if (k.backup_ready && may_stand_in && k.backup_ready->ok()) return &*k.backup_ready;
  return nullptr;
}

// Decodes a, chunk c's FrameToDecode (its backup unless the planned frame
// is here).
void FetchSession::StartDecode(uint32_t c, const Arrival& a) {
  const bool from_backup = !chunks_[c].ready;
  Discard(c);  // decoded from the other frame: not what is handed over
  if (io_->DecoderIdle()) decode_began_ = io_->Now();
  io_->Submit(c, from_backup, a.request.id);
}

// Keeps the decoder busy: chunk next_deliver_ once it is here, else the
// earliest later chunk whose frame is here and will be handed over (its
// planned frame, or its backup where that stands in for it), so that chunks
// arrived early (backups of the latest chunks, above all) are not all
// decoded after the last one to arrive. At most read_ahead decoded (or
// decoding) chunks wait. A chunk earlier than the one waiting in the decoder
// takes its place.
void FetchSession::DecodeNext() {
  uint32_t waiting = 0;
  for (uint32_t c = next_deliver_; c < chunks_.size(); ++c) {
    const Arrival* a = FrameToDecode(c);
    if (!a) continue;
    if (DecodedAhead(c) || io_->DecoderHas(c, !chunks_[c].ready)) {
      waiting += c > next_deliver_;
      continue;
    }
    if (c > next_deliver_ && waiting >= options_.read_ahead) return;
    io_->UnsubmitAfter(c);
    if (io_->DecoderFull()) return;
    StartDecode(c, *a);
    waiting += c > next_deliver_;
  }
}

void FetchSession::OnDecoded(uint32_t c, bool from_backup, const Status& status, const DecodeCost& cost) {
  decode_began_ = io_->Now();  // the waiting decode, if any, runs from here
  if (c >= chunks_.size()) return;
  if (c < next_deliver_) {  // handed over or skipped meanwhile
    if (status.ok()) io_->Discard(c, from_backup);
    return;
  }
  Chunk& k = chunks_[c];
  // With one decode thread, a decode during which bytes arrived costs its
  // own CPU time, and the rest of its wall time was lost to receiving them
  // (LevelPlanner, "Receiving shares the CPU").
  if (status.ok() && decoder_measured_) planner_.OnDecoderLoss(cost.wall_s, cost.cpu_s, cost.arrived);
  if (from_backup && k.ready) {  // the planned frame came meanwhile
    if (status.ok()) io_->Discard(c, from_backup);
    return;
  }
  if (k.ahead && k.ahead->from_backup != from_backup) Discard(c);
  k.ahead = Decoded{from_backup, status, cost};
}

// Hands over chunk next_deliver_ once it is decoded (or failed, or is to be
// recomputed); false if not yet.
bool FetchSession::DeliverOne() {
  if (next_deliver_ >= chunks_.size() || next_deliver_ >= next_issue_) return false;
  const uint32_t i = next_deliver_;
  Chunk& k = chunks_[i];
  const bool from_backup = !k.ready && k.use_backup;
  if (!k.skipped && !k.ready && !(from_backup && (k.backup_ready || k.backup_failed))) return false;
  if (FrameToDecode(i) && !DecodedAhead(i)) return false;  // DecodeNext decodes it
  ++next_deliver_;
  if (k.skipped) {
    Discard(i);
    if (k.ready) io_->Forget(k.ready->request.id);
    if (k.backup_ready) io_->Forget(k.backup_ready->request.id);
    return true;
  }
  std::optional<Decoded> decoded = std::move(k.ahead);
  k.ahead.reset();
  if (from_backup && !k.backup_ready) {
    Fail(i, "backup request failed");
    return true;
  }
  const Arrival a = std::move(from_backup ? *k.backup_ready : *k.ready);
  if (k.backup_ready && !from_backup) io_->Forget(k.backup_ready->request.id);
  k.ready.reset();
  k.backup_ready.reset();
  DropBackup(i);
  if (from_backup) ++result_.from_backup;
  if (!a.ok()) {
    io_->Forget(a.request.id);
    Fail(i, a.status.ToString());
    return true;
  }
  if (!decoded->status.ok()) {
    io_->Forget(a.request.id);
    Fail(i, decoded->status.ToString());
    return true;
  }
  const double handed0 = io_->Now();
  io_->HandOver(i, from_backup, a.request.id, a.request.level);
  result_.decode_ms += decoded->cost.wall_s * 1000.0;
  // One decode thread: the decode's own CPU time where bytes arrived
  // meanwhile (the rest was lost to receiving them); else its wall time.
  const double cost_s =
      decoder_measured_ && decoded->cost.arrived > 0 ? decoded->cost.cpu_s : decoded->cost.wall_s;
  const uint32_t tokens = planner_.chunk(i).tokens;
  planner_.OnProcessed(cost_s + (io_->Now() - handed0), a.request.level, tokens);
  if (a.request.level < static_cast<int>(kMaxChunkLevels)) {
    level_decoded_s_[a.request.level] += cost_s;
    level_decoded_tokens_[a.request.level] += tokens;
  }
  result_.levels[i] = a.request.level;
  return true;
}

// Take every finished fetch and decode (the driver, before), keep the
// decoder busy, measure, re-issue what the deadline needs coarser, refill
// the pipeline (so requests are issued with the newest estimate), hand over
// what is decoded and keep the decoder busy.
bool FetchSession::Step() {
  DecodeNext();  // first: the decoder idles until then
  Observe();
  Reissue();
  IssueRequests();
  if (DeliverOne()) return true;
  DecodeNext();
  // Everything left is skipped or issuable.
  return flight_.empty() && OpenBackups() == 0 && io_->DecoderIdle() && !done();
}

void FetchSession::Finish(double elapsed_s) {
  for (uint32_t i = 0; i < result_.levels.size(); ++i)
    if (result_.levels[i] < 0) result_.recompute.push_back(i);
  result_.elapsed_ms = elapsed_s * 1000.0;
  result_.deadline_met = !result_.timed_out && result_.elapsed_ms <= options_.deadline_ms;
  result_.bandwidth_bytes_s = planner_.bandwidth();
  result_.receive_cost_ns_per_byte = planner_.ReceiveCost() * 1e9;
}

}  // namespace cachegen
