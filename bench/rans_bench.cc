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
// A cachegen-section-like workload: 16 streams parsed and decoded together
// (8-lane streams in AVX2 lockstep groups, one-lane streams in scalar
// lockstep groups). Args: lanes, symbols per stream.
void BM_RansDecodeStreams(benchmark::State& state) {
  constexpr size_t kStreams = 16;
  const auto lanes = static_cast<uint32_t>(state.range(0));
  const auto kN = static_cast<size_t>(state.range(1));
  const auto syms = GeometricSymbols(kStreams * kN);
  std::vector<uint8_t> buf;
  cachegen::ByteWriter w(&buf);
  for (size_t k = 0; k < kStreams; ++k)
    cachegen::rans::EncodeStream(std::span<const uint32_t>(&syms[k * kN], kN), w, {.lanes = lanes});
  std::vector<uint32_t> out(kStreams * kN);
  std::vector<cachegen::rans::ParsedStream> parsed(kStreams);
  std::vector<cachegen::rans::ParsedStream*> ps;
  std::vector<uint32_t*> outs;
  for (size_t k = 0; k < kStreams; ++k) ps.push_back(&parsed[k]), outs.push_back(&out[k * kN]);
  for (auto _ : state) {
    cachegen::ByteReader r(buf);
    for (size_t k = 0; k < kStreams; ++k) {
      auto st = cachegen::rans::ParseStream(r, kN, &parsed[k]);
      if (!st.ok()) state.SkipWithError(st.message().c_str());
    }
    auto st = cachegen::rans::DecodeParsed(ps, outs);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kStreams * kN));
}
// 16K symbols: a 64-dim head's stream in a 256-token chunk; 1024 and 2048: the
// short streams the encoder writes with one lane (8-dim heads, short chunks).
BENCHMARK(BM_RansDecodeStreams)
    ->ArgNames({"lanes", "n"})
    ->Args({8, 16384})
    ->Args({8, 2048})
    ->Args({1, 2048})
    ->Args({8, 1024})
    ->Args({1, 1024});

// Streams of a section with channel classes: 16 streams coded with a cycle
// of 8 tables (rows of an 8-dim head, one table per channel), decoded
// together (rans::DecodeStreamsWithTables: lockstep groups with a table per
// symbol), against BM_RansDecodeStreams' one-table streams. Args: lanes,
// symbols per stream.
void BM_RansDecodeTableCycle(benchmark::State& state) {
  constexpr size_t kStreams = 16, kPeriod = 8;
  const auto lanes = static_cast<uint32_t>(state.range(0));
  const auto kN = static_cast<size_t>(state.range(1));
  const auto syms = GeometricSymbols(kStreams * kN);
  std::vector<uint64_t> hist(64, 0);
  for (uint32_t x : syms) ++hist[std::min<uint32_t>(x, 63)];
  // Distinct table objects (equal contents), so the cycle path is taken.
  std::vector<cachegen::rans::FreqTable> tables(kPeriod, cachegen::rans::MakeFreqTable(hist));
  std::vector<cachegen::rans::DecodeTable> decode(kPeriod);
  std::vector<const cachegen::rans::FreqTable*> cycle;
  std::vector<const cachegen::rans::DecodeTable*> decode_cycle;
  for (size_t p = 0; p < kPeriod; ++p) {
    cachegen::rans::BuildDecodeTable(tables[p], &decode[p]);
    cycle.push_back(&tables[p]);
    decode_cycle.push_back(&decode[p]);
  }
  std::vector<uint8_t> buf;
  cachegen::ByteWriter w(&buf);
  const cachegen::rans::EncodeOptions options{.lanes = lanes};
  for (size_t k = 0; k < kStreams; ++k)
    cachegen::rans::EncodeStreamWithTables(std::span<const uint32_t>(&syms[k * kN], kN), cycle, w, options);
  std::vector<uint32_t> out(kStreams * kN);
  std::vector<cachegen::rans::TableStream> parsed(kStreams);
  std::vector<cachegen::rans::TableStream*> ps;
  for (auto& p : parsed) ps.push_back(&p);
  for (auto _ : state) {
    cachegen::ByteReader r(buf);
    for (size_t k = 0; k < kStreams; ++k) {
      auto st = cachegen::rans::ParseStreamWithTables(r, decode_cycle, {&out[k * kN], kN}, &parsed[k]);
      if (!st.ok()) state.SkipWithError(st.message().c_str());
    }
    auto st = cachegen::rans::DecodeStreamsWithTables(ps);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kStreams * kN));
}
BENCHMARK(BM_RansDecodeTableCycle)->ArgNames({"lanes", "n"})->Args({1, 2048})->Args({8, 2048})->Args({8, 16384});

BENCHMARK(BM_RansEncode)->Unit(benchmark::kMillisecond);

void BM_RansEstimate(benchmark::State& state) {
  const auto syms = GeometricSymbols(1 << 16);
  std::vector<uint64_t> h(64);
  for (uint32_t x : syms) ++h[std::min<uint32_t>(x, 63)];
  for (auto _ : state) benchmark::DoNotOptimize(cachegen::rans::EstimateStreamBytes(h));
}
BENCHMARK(BM_RansEstimate);

}  // namespace
