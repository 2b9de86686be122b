// `cachegen bench-store`: put/get throughput and latency percentiles of one
// or more chunk stores, side by side in one run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/store.h"

namespace cachegen::cli {
namespace {

struct BenchStoreArgs {
  std::vector<std::string> uris;
  uint64_t frame_bytes = 256 * 1024;
  uint32_t ops = 200;
  uint32_t threads = 1;
  bool json = false;
};

struct Phase {
  double seconds = 0;
  uint64_t ok = 0, errors = 0;
  double p50_us = 0, p99_us = 0;
};

// Runs op(i) for i in [0, n) on `threads` threads; per-op latency percentiles.
template <typename Op>
Phase RunPhase(uint32_t n, uint32_t threads, const Op& op) {
  std::vector<double> lat(n);
  std::atomic<uint32_t> next{0};
  std::atomic<uint64_t> ok{0}, errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (uint32_t i; (i = next.fetch_add(1)) < n;) {
        const auto s = std::chrono::steady_clock::now();
        (op(i) ? ok : errors)++;
        lat[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count();
      }
    });
  for (auto& th : pool) th.join();
  Phase p;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.ok = ok;
  p.errors = errors;
  std::sort(lat.begin(), lat.end());
  if (!lat.empty()) {
    p.p50_us = lat[lat.size() / 2];
    p.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  return p;
}

int RunBenchStore(const BenchStoreArgs& a) {
  if (a.ops == 0 || a.threads == 0 || a.frame_bytes == 0)
    return Fail(Status::InvalidArgument("--ops, --threads and --frame-bytes must be positive"));
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> frame(a.frame_bytes);
  for (auto& b : frame) b = static_cast<uint8_t>(rng());
  nlohmann::json out = nlohmann::json::array();
  if (!a.json)
    std::printf("%-44s %4s %10s %9s %9s %9s %6s\n", "store", "op", "ops/s", "MB/s", "p50 us", "p99 us", "errors");
  for (const std::string& uri : a.uris) {
    auto s = OpenStore(uri);
    if (!s.ok()) return Fail(s.status());
    ChunkStore& store = **s;
    std::vector<ChunkKey> keys(a.ops);  // fresh random keys: no collision with stored entries
    for (auto& k : keys)
      for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
    const Phase put = RunPhase(a.ops, a.threads, [&](uint32_t i) { return store.Put(keys[i], 0, frame).ok(); });
    const Phase get = RunPhase(a.ops, a.threads, [&](uint32_t i) {
      auto r = store.Get(keys[i], 0);
      return r.ok() && r->size() == frame.size();
    });
    for (const auto& k : keys) (void)store.Delete(k, 0);
    nlohmann::json j{{"uri", store.uri()}, {"frame_bytes", a.frame_bytes}, {"ops", a.ops}, {"threads", a.threads}};
    for (const auto& [name, p] : {std::pair{"put", put}, std::pair{"get", get}}) {
      const double ops_s = static_cast<double>(p.ok) / p.seconds;
      const double mb_s = ops_s * static_cast<double>(a.frame_bytes) / 1e6;
      j[name] = {{"ops_per_s", ops_s}, {"mb_per_s", mb_s}, {"p50_us", p.p50_us}, {"p99_us", p.p99_us}, {"errors", p.errors}};
      if (!a.json)
        std::printf("%-44s %4s %10.0f %9.1f %9.0f %9.0f %6llu\n", store.uri().substr(0, 44).c_str(), name, ops_s,
                    mb_s, p.p50_us, p.p99_us, static_cast<unsigned long long>(p.errors));
    }
    out.push_back(j);
  }
  if (a.json) std::printf("%s\n", nlohmann::json{{"stores", out}}.dump().c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(46, [](CLI::App& root) -> CommandRunner {
  auto args = std::make_shared<BenchStoreArgs>();
  CLI::App* sub = root.add_subcommand("bench-store", "Put/get throughput and p50/p99 latency of chunk stores");
  sub->add_option("--store", args->uris, "Store URI (repeat to compare several in one run)")->required();
  sub->add_option("--frame-bytes", args->frame_bytes, "Bytes per frame")->capture_default_str();
  sub->add_option("--ops", args->ops, "Frames put, then got, per store")->capture_default_str();
  sub->add_option("--threads", args->threads, "Concurrent clients")->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return [sub, args] { return *sub ? std::optional<int>(RunBenchStore(*args)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
