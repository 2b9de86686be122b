// Internal: a link's capacity over time as delivery opportunities, for the
// streaming simulation (issue "streaming decisions judged on real link
// traces"): mahimahi's trace format, one line per 1500-byte opportunity,
// an integer millisecond from the trace's start, repeated k times for k
// packets in that millisecond; the trace loops with the period of its last
// timestamp. A time scale S compresses the time axis (a packet at t ms comes
// at t/S ms), so a cellular trace's shape stands for an S-fold faster link.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/status.h"

namespace cachegen::sim {

class LinkTrace {
 public:
  static constexpr uint32_t kPacketBytes = 1500;

  // Parses a trace: non-decreasing integer milliseconds, one per line (blank
  // lines ignored); at least one, the last > 0. kInvalidArgument names the
  // first bad line. time_scale must be > 0.
  static Result<LinkTrace> Parse(std::string_view text, double time_scale = 1.0);
  static Result<LinkTrace> Load(const std::string& path, double time_scale = 1.0);
  // A constant rate: one opportunity every kPacketBytes / bytes_per_s seconds.
  static LinkTrace Constant(double bytes_per_s);

  // Time in seconds of opportunity `index`, counted over the loops.
  double TimeOfPacket(uint64_t index) const;
  // Index of the first opportunity at or after t_s (>= 0).
  uint64_t FirstPacketAt(double t_s) const;
  double period_s() const { return period_s_; }
  uint64_t packets_per_period() const { return times_s_.size(); }
  double mean_bytes_per_s() const { return static_cast<double>(times_s_.size()) * kPacketBytes / period_s_; }

 private:
  LinkTrace(std::vector<double> times_s, double period_s) : times_s_(std::move(times_s)), period_s_(period_s) {}
  std::vector<double> times_s_;  // one period's opportunities, ascending, in (or at the ends of) [0, period]
  double period_s_ = 0;
};

// Transfers sharing one link first come, first served, on a clock that only
// moves forward (AdvanceTo): each opportunity of the trace goes to the
// oldest transfer not done whose start has come; one that finds none passes
// unused. A cancelled transfer's bytes not delivered yet are never sent.
// Times are the caller's, the trace read from offset_s on (a trial's start
// in the trace).
class LinkQueue {
 public:
  explicit LinkQueue(const LinkTrace* trace, double offset_s = 0) : trace_(trace), offset_s_(offset_s) {}

  // Queues `bytes` whose first byte may arrive at start_s (not before an
  // earlier Send's start_s, nor before now()). Returns its id.
  uint32_t Send(double start_s, uint64_t bytes);
  void Cancel(uint32_t id);
  // Delivers the opportunities at or before t_s (>= now()).
  void AdvanceTo(double t_s);
  double now() const { return now_s_; }
  uint64_t Received(uint32_t id) const { return transfers_[id].received; }
  uint64_t received_total() const { return received_total_; }  // every transfer's
  bool Done(uint32_t id) const { return transfers_[id].done_s >= 0; }
  double DoneAt(uint32_t id) const { return transfers_[id].done_s; }  // < 0: not done
  // When its first bytes arrived; < 0 before any.
  double FirstByteAt(uint32_t id) const { return transfers_[id].first_s; }
  // When the next transfer will be done if nothing is sent or cancelled
  // meanwhile; infinity when none is queued.
  double NextDone() const;
  // Time at which `packets` opportunities, taken back to back from start_s
  // on an idle link, have all passed (start_s when packets = 0).
  double ArrivalOfPackets(double start_s, uint64_t packets) const;

 private:
  struct Transfer {
    uint64_t bytes = 0;
    uint64_t received = 0;
    double start_s = 0;
    double done_s = -1;
    double first_s = -1;  // its first opportunity taken
  };
  // The first opportunity transfer `t` may take.
  uint64_t FirstPacketFor(const Transfer& t) const;
  double TimeOf(uint64_t packet) const { return trace_->TimeOfPacket(packet) - offset_s_; }
  static uint64_t PacketsFor(uint64_t bytes) { return (bytes + LinkTrace::kPacketBytes - 1) / LinkTrace::kPacketBytes; }

  const LinkTrace* trace_;
  double offset_s_ = 0;
  double now_s_ = 0;
  uint64_t next_packet_ = 0;  // the first opportunity not passed yet
  uint64_t received_total_ = 0;
  std::vector<Transfer> transfers_;
  std::vector<uint32_t> queue_;  // not done and not cancelled, oldest first
};

}  // namespace cachegen::sim
