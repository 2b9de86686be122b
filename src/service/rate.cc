// Rates, traces and the LinkShaper token bucket (include/cachegen/service.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <thread>

#include "cachegen/service.h"

namespace cachegen {

Result<double> ParseRate(std::string_view text) {
  std::string_view s = text;
  auto suffix = [&](std::string_view suf) {
    if (s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf) {
      s.remove_suffix(suf.size());
      return true;
    }
    return false;
  };
  double scale = 1;
  if (suffix("gbit")) scale = 1e9;
  else if (suffix("mbit")) scale = 1e6;
  else if (suffix("kbit")) scale = 1e3;
  else if (!suffix("bit"))
    return Status::InvalidArgument("bad rate '" + std::string(text) + "' (want e.g. 1gbit, 100mbit, 64kbit)");
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !(v > 0) || !std::isfinite(v))
    return Status::InvalidArgument("bad rate '" + std::string(text) + "' (want a positive number and a unit)");
  return v * scale / 8.0;
}

Result<std::vector<RateStep>> ParseRateTrace(std::string_view text) {
  std::vector<RateStep> steps;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t j = std::min(text.find(',', i), text.size());
    std::string_view part = text.substr(i, j - i);
    RateStep step;
    const size_t at = part.find('@');
    if (at != std::string_view::npos) {
      const std::string_view t = part.substr(at + 1);
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), step.start_s);
      if (ec != std::errc() || p != t.data() + t.size() || !(step.start_s >= 0))
        return Status::InvalidArgument("bad trace step '" + std::string(part) + "' (want RATE@SECONDS)");
      part = part.substr(0, at);
    }
    CG_ASSIGN_OR_RETURN(step.bytes_per_s, ParseRate(part));
    if (steps.empty() ? step.start_s != 0 : step.start_s <= steps.back().start_s)
      return Status::InvalidArgument("bad trace '" + std::string(text) +
                                     "': the first step starts at 0, later ones at increasing times");
    steps.push_back(step);
    i = j + 1;
  }
  return steps;
}

LinkShaper::LinkShaper(std::vector<RateStep> trace, uint64_t burst_bytes)
    : trace_(std::move(trace)), burst_(static_cast<double>(burst_bytes)), start_(std::chrono::steady_clock::now()) {
  if (trace_.empty()) trace_.push_back({0, 1e30});
}

void LinkShaper::Restart() {
  std::lock_guard<std::mutex> lock(mu_);
  start_ = std::chrono::steady_clock::now();
  next_free_s_ = 0;
}

double LinkShaper::RateAt(double t_s) const {
  double r = trace_.front().bytes_per_s;
  for (const RateStep& s : trace_)
    if (s.start_s <= t_s) r = s.bytes_per_s;
  return r;
}

void LinkShaper::Acquire(uint64_t bytes) {
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = RateAt(std::max(now, next_free_s_));
    // Unused credit is capped at the burst size.
    const double begin = std::max(next_free_s_, now - burst_ / rate);
    next_free_s_ = begin + static_cast<double>(bytes) / rate;
    if (next_free_s_ <= now) return;
    until = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(next_free_s_));
  }
  std::this_thread::sleep_until(until);
}

}  // namespace cachegen
