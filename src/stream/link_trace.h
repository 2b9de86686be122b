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

// Transfers sharing one link first come, first served: each takes the next
// opportunities after those of the transfers sent before it, from the
// moment it is sent. The link is idle (its opportunities pass unused) while
// nothing is queued.
class LinkQueue {
 public:
  explicit LinkQueue(const LinkTrace* trace) : trace_(trace) {}

  struct Transfer {
    uint64_t bytes = 0;
    uint64_t first_packet = 0;  // its opportunities: [first_packet, first_packet + packets)
    uint64_t packets = 0;
    double sent_s = 0;
    double done_s = 0;  // its last byte's arrival (sent_s for an empty transfer)
  };
  // Queues `bytes` sent at sent_s (not before the previous Send's sent_s).
  Transfer Send(double sent_s, uint64_t bytes);
  // Bytes of `t` arrived by t_s.
  uint64_t ReceivedBy(const Transfer& t, double t_s) const;

 private:
  const LinkTrace* trace_;
  uint64_t next_packet_ = 0;  // the first opportunity no transfer has taken
};

}  // namespace cachegen::sim
