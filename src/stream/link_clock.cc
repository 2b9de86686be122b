// LinkClock (link_clock.h).
#include "stream/link_clock.h"

#include <algorithm>
#include <utility>

namespace cachegen {

size_t LinkClock::Issue(double at) {
  requests_.push_back({at + latency_s_, -1, at});
  return requests_.size() - 1;
}

void LinkClock::Finish(size_t i, double at, double first_byte_at, unsigned pieces) {
  if (i >= requests_.size() || requests_[i].to >= 0) return;
  Request& r = requests_[i];
  r.to = std::max(at, r.issued);
  if (pieces < 2 || first_byte_at < r.issued) return;
  const double wait = first_byte_at - r.issued;
  if (!latency_known_ || wait < latency_s_) latency_s_ = wait;
  latency_known_ = true;
}

double LinkClock::BusySeconds(double now) const {
  std::vector<std::pair<double, double>> spans;
  spans.reserve(requests_.size());
  for (const Request& r : requests_) {
    const double end = r.to >= 0 ? r.to : now;
    if (end > r.from) spans.emplace_back(r.from, end);
  }
  std::sort(spans.begin(), spans.end());
  double busy = 0, covered = -1e300;
  for (const auto& [from, to] : spans) {
    const double start = std::max(from, covered);
    if (to > start) busy += to - start;
    covered = std::max(covered, to);
  }
  return busy;
}

}  // namespace cachegen
