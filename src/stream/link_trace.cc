// LinkTrace and LinkQueue (link_trace.h).
#include "stream/link_trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "kv/io.h"

namespace cachegen::sim {
namespace {

// A trace file larger than this is refused before it is read whole: the
// longest shared trace (786 s of LTE) is 2.3 MB.
constexpr uint64_t kMaxTraceBytes = 256ull << 20;

}  // namespace

Result<LinkTrace> LinkTrace::Parse(std::string_view text, double time_scale) {
  if (!(time_scale > 0) || !std::isfinite(time_scale))
    return Status::InvalidArgument("link trace: time scale must be > 0");
  std::vector<double> times;
  uint64_t last_ms = 0;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    uint64_t ms = 0;
    const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), ms);
    if (ec != std::errc() || p != line.data() + line.size() || ms > (1ull << 40))
      return Status::InvalidArgument("link trace line " + std::to_string(line_no) + ": not a millisecond count");
    if (ms < last_ms)
      return Status::InvalidArgument("link trace line " + std::to_string(line_no) + ": time goes backwards");
    last_ms = ms;
    times.push_back(static_cast<double>(ms) / 1000.0 / time_scale);
  }
  if (times.empty()) return Status::InvalidArgument("link trace: no delivery opportunities");
  if (last_ms == 0) return Status::InvalidArgument("link trace: its last time must be > 0 ms (the loop period)");
  const double period = static_cast<double>(last_ms) / 1000.0 / time_scale;
  return LinkTrace(std::move(times), period);
}

Result<LinkTrace> LinkTrace::Load(const std::string& path, double time_scale) {
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path, kMaxTraceBytes));
  Result<LinkTrace> t = Parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), time_scale);
  if (!t.ok()) return Status::InvalidArgument(path + ": " + t.status().message());
  return t;
}

LinkTrace LinkTrace::Constant(double bytes_per_s) {
  const double gap = kPacketBytes / bytes_per_s;
  return LinkTrace({gap}, gap);
}

double LinkTrace::TimeOfPacket(uint64_t index) const {
  const uint64_t n = times_s_.size();
  return static_cast<double>(index / n) * period_s_ + times_s_[index % n];
}

uint64_t LinkTrace::FirstPacketAt(double t_s) const {
  if (!(t_s > 0)) return 0;
  const uint64_t n = times_s_.size();
  const auto loop = static_cast<uint64_t>(std::floor(t_s / period_s_));
  // A loop's opportunities lie in [loop * period, (loop + 1) * period]: the
  // previous loop's last ones can still be at or after t_s.
  for (uint64_t l = loop > 0 ? loop - 1 : 0; l <= loop; ++l) {
    const double in_loop = t_s - static_cast<double>(l) * period_s_;
    const auto it = std::lower_bound(times_s_.begin(), times_s_.end(), in_loop);
    if (it != times_s_.end()) return l * n + static_cast<uint64_t>(it - times_s_.begin());
  }
  return (loop + 1) * n;
}

uint32_t LinkQueue::Send(double start_s, uint64_t bytes) {
  transfers_.push_back({bytes, 0, std::max(start_s, now_s_), -1});
  const uint32_t id = static_cast<uint32_t>(transfers_.size() - 1);
  queue_.push_back(id);
  AdvanceTo(now_s_);  // an empty transfer starting now is done now
  return id;
}

void LinkQueue::Cancel(uint32_t id) { std::erase(queue_, id); }

uint64_t LinkQueue::FirstPacketFor(const Transfer& t) const {
  return std::max(next_packet_, trace_->FirstPacketAt(t.start_s + offset_s_));
}

void LinkQueue::AdvanceTo(double t_s) {
  now_s_ = std::max(now_s_, t_s);
  // Opportunities at or before now: those before the first one after it,
  // by the same arithmetic as NextDone's times (an offset's rounding must
  // not leave a transfer done by NextDone and not by AdvanceTo).
  uint64_t passed = trace_->FirstPacketAt(now_s_ + offset_s_);
  while (TimeOf(passed) <= now_s_) ++passed;
  while (passed > 0 && TimeOf(passed - 1) > now_s_) --passed;
  while (!queue_.empty()) {
    Transfer& t = transfers_[queue_.front()];
    if (t.start_s > now_s_) break;
    const uint64_t need = PacketsFor(t.bytes - t.received);
    if (need == 0) {  // done once those before it are
      t.done_s = next_packet_ > 0 ? std::max(t.start_s, TimeOf(next_packet_ - 1)) : t.start_s;
      queue_.erase(queue_.begin());
      continue;
    }
    const uint64_t first = FirstPacketFor(t);
    if (first >= passed) break;
    const uint64_t take = std::min(need, passed - first);
    const uint64_t received = std::min(t.bytes, t.received + take * uint64_t{LinkTrace::kPacketBytes});
    received_total_ += received - t.received;
    if (t.first_s < 0) t.first_s = TimeOf(first);
    t.received = received;
    next_packet_ = first + take;
    if (take < need) break;
    t.done_s = TimeOf(next_packet_ - 1);
    queue_.erase(queue_.begin());
  }
}

double LinkQueue::NextDone() const {
  if (queue_.empty()) return INFINITY;
  const Transfer& t = transfers_[queue_.front()];
  const uint64_t need = PacketsFor(t.bytes - t.received);
  if (need == 0) return t.start_s;
  return TimeOf(FirstPacketFor(t) + need - 1);
}

double LinkQueue::ArrivalOfPackets(double start_s, uint64_t packets) const {
  if (packets == 0) return start_s;
  return TimeOf(trace_->FirstPacketAt(start_s + offset_s_) + packets - 1);
}

}  // namespace cachegen::sim
