// rANS decode throughput: 4M symbols from a geometric distribution with about
// 2 bits of entropy per symbol. Reports symbols/s as items/s and output
// symbol bytes (uint32) per second as bytes/s.
#include <benchmark/benchmark.h>

#include <random>

#include "codec/rans.h"

namespace {

std::vector<uint32_t> GeometricSymbols(size_t n) {
  std::mt19937_64 rng(42);
  std::geometric_distribution<uint32_t> d(0.5);  // H = 2 bits
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void BM_RansDecode(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(1));
  const auto syms = GeometricSymbols(n);
  std::vector<uint8_t> buf;
  cachegen::ByteWriter w(&buf);
  cachegen::rans::EncodeStream(syms, w, {static_cast<uint32_t>(state.range(0))});
  std::vector<uint32_t> out(n);
  for (auto _ : state) {
    cachegen::ByteReader r(buf);
    auto st = cachegen::rans::DecodeStream(r, out);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(uint32_t)));
  state.counters["bits_per_symbol"] = 8.0 * static_cast<double>(buf.size()) / static_cast<double>(n);
}
// Args: lanes, symbols. 4M symbols is the headline case (output exceeds the
// caches); 64K shows the coder without memory-bandwidth limits.
BENCHMARK(BM_RansDecode)
    ->ArgNames({"lanes", "n"})
    ->Args({1, 4 << 20})
    ->Args({4, 4 << 20})
    ->Args({8, 4 << 20})
    ->Args({16, 4 << 20})
    ->Args({32, 4 << 20})
    ->Args({8, 1 << 16})
    ->Unit(benchmark::kMicrosecond);

void BM_RansEncode(benchmark::State& state) {
  const size_t n = 4u << 20;
  const auto syms = GeometricSymbols(n);
  std::vector<uint8_t> buf;
  for (auto _ : state) {
    buf.clear();
    cachegen::ByteWriter w(&buf);
    cachegen::rans::EncodeStream(syms, w);
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_RansEncode)->Unit(benchmark::kMillisecond);

void BM_RansEstimate(benchmark::State& state) {
  const auto syms = GeometricSymbols(1 << 16);
  std::vector<uint64_t> h(64);
  for (uint32_t x : syms) ++h[std::min<uint32_t>(x, 63)];
  for (auto _ : state) benchmark::DoNotOptimize(cachegen::rans::EstimateStreamBytes(h));
}
BENCHMARK(BM_RansEstimate);

}  // namespace
