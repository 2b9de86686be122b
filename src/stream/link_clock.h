// Internal: the link's busy time as the streaming client measures its rate
// (FetchIo::BusySeconds), from when requests were issued, when their first
// bytes came and when they finished. Pure logic: times are the caller's
// seconds on one clock.
//
// A request's first `latency` seconds are a round trip, not link time: a
// fetch that requests one frame at a time, or too few to cover the round
// trip, would otherwise read the round trip as a slower link (at 50 Gbit/s
// a 200 KB frame crosses in 0.03 ms after a 1 ms round trip: 30x too
// slow). Busy time is the union, over requests, of [issued + latency, finished]
// (or now while unfinished). The latency is the least time to a first byte
// of the requests finished so far whose frame came in more than one piece
// (one piece, or no progress reported, cannot tell the wait from the
// transfer), and each request keeps the latency known when it was issued,
// so busy time never decreases. Time after the round trip during which
// nothing arrived stays busy: a link that stalls is a slower link.
#pragma once

#include <cstddef>
#include <vector>

namespace cachegen {

class LinkClock {
 public:
  // A request issued at `at`; returns its index.
  size_t Issue(double at);
  // Request i finished (arrived, failed or was abandoned) at `at`; its first
  // bytes came at first_byte_at (< 0: none reported), in `pieces` progress
  // reports.
  void Finish(size_t i, double at, double first_byte_at, unsigned pieces);
  double BusySeconds(double now) const;
  double latency_s() const { return latency_s_; }

 private:
  struct Request {
    double from = 0;  // issued + the latency known then
    double to = -1;   // finished; < 0 while outstanding
    double issued = 0;
  };
  std::vector<Request> requests_;
  double latency_s_ = 0;
  bool latency_known_ = false;
};

}  // namespace cachegen
