// rANS modelling: symbol counts and stream statistics, the escape threshold
// and lane choice, frequency normalisation (the Plan), profile FreqTables and
// the costs of coding with a cycle of tables.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/rans.h"
#include "codec/rans_internal.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen::rans {
namespace internal {
namespace {

double XLog2X(uint64_t c) { return c == 0 ? 0.0 : static_cast<double>(c) * std::log2(static_cast<double>(c)); }

// How many rows of Stats::win can hold counts: values reach kVarintStep[k]
// only for k below this (the other rows, and their ge, are zero).
int VarintRows(uint64_t max_value) {
  int rows = 1;
  while (rows < 5 && max_value >= kVarintStep[rows]) ++rows;
  return rows;
}

// Chooses E in [2, min(255, max(2, max_value + 1))] minimising entropy bits
// of the direct+escape symbols plus the escape area plus (roughly) the table.
uint32_t ChooseEscape(const Stats& s, std::array<std::array<uint64_t, 256>, 5>* ge_out) {
  // ge[k][E] = count of values >= E + kVarintStep[k], for E in [0, 256);
  // rows that can only be zero are left unset.
  auto& ge = *ge_out;
  const int rows = VarintRows(s.max_value);
  for (int k = 0; k < rows; ++k) {
    uint64_t acc = s.tail[k];
    for (int j = 255; j >= 0; --j) {
      acc += s.win[k][j];
      ge[k][j] = acc;
    }
  }
  const uint32_t hi = static_cast<uint32_t>(std::clamp<uint64_t>(s.max_value + 1, kMinEscape, kMaxEscape));
  const double nlogn = XLog2X(s.n);
  const uint64_t big = s.n / 32 + 1;  // counts whose frequency likely needs a 2-byte varint
  double direct_sum = 0;  // sum over v < E of c log c
  uint32_t big_count = 0;
  for (uint32_t v = 0; v < kMinEscape; ++v) {
    direct_sum += XLog2X(s.win[0][v]);
    big_count += s.win[0][v] >= big;
  }
  uint32_t best = kMinEscape;
  double best_bits = 0;
  double escape_term = XLog2X(ge[0][kMinEscape]);
  for (uint32_t e = kMinEscape; e <= hi; ++e) {
    // Both log terms change only where value e - 1 occurs.
    if (e > kMinEscape && s.win[0][e - 1] != 0) {
      direct_sum += XLog2X(s.win[0][e - 1]);
      big_count += s.win[0][e - 1] >= big;
      escape_term = XLog2X(ge[0][e]);
    }
    uint64_t esc_bytes = 0;
    for (int k = 0; k < rows; ++k) esc_bytes += ge[k][e];
    const double bits = nlogn - direct_sum - escape_term + 8.0 * static_cast<double>(esc_bytes + e + 1 + big_count);
    if (e == kMinEscape || bits < best_bits) {
      best_bits = bits;
      best = e;
    }
  }
  return best;
}

// Scales counts (sum n > 0) to frequencies summing to kProbScale, every
// present symbol >= 1. Rounds, then fixes the sum: a surplus goes to the most
// frequent symbol; a deficit is taken one unit at a time from the symbol where
// it costs the fewest bits (approximately count / freq).
void Normalize(const uint64_t* count, uint32_t alphabet, uint64_t n, uint32_t* freq) {
  int64_t sum = 0;
  uint32_t argmax = 0;
  const double scale = static_cast<double>(kProbScale) / static_cast<double>(n);
  for (uint32_t s = 0; s < alphabet; ++s) {
    if (count[s] == 0) {
      freq[s] = 0;
      continue;
    }
    const double f = std::floor(static_cast<double>(count[s]) * scale + 0.5);
    freq[s] = static_cast<uint32_t>(std::clamp(f, 1.0, static_cast<double>(kProbScale)));
    sum += freq[s];
    if (count[s] > count[argmax]) argmax = s;
  }
  int64_t diff = static_cast<int64_t>(kProbScale) - sum;
  if (diff > 0) {
    freq[argmax] += static_cast<uint32_t>(diff);
    return;
  }
  while (diff < 0) {
    // At least one symbol has freq > 1 because sum > kProbScale >= alphabet.
    uint32_t pick = alphabet;
    double pick_cost = 0;
    for (uint32_t s = 0; s < alphabet; ++s) {
      if (freq[s] <= 1) continue;
      const double cost = static_cast<double>(count[s]) / (static_cast<double>(freq[s]) - 0.5);
      if (pick == alphabet || cost < pick_cost) {
        pick = s;
        pick_cost = cost;
      }
    }
    --freq[pick];
    ++diff;
  }
}

void AddValue(Stats* s, uint64_t v, uint64_t c) {
  for (int k = 0; k < 5; ++k) {
    if (v < kVarintStep[k]) break;
    const uint64_t j = v - kVarintStep[k];
    if (j < 256) {
      s->win[k][j] += c;
    } else {
      s->tail[k] += c;
    }
  }
}

}  // namespace

uint32_t LanesFor(double bits, uint64_t n, const EncodeOptions& options) {
  if (bits < 8.0 * options.single_lane_below_bytes) return 1;
  return static_cast<uint32_t>(std::min<uint64_t>(std::clamp<uint32_t>(options.lanes, 1, kMaxLanes), n));
}

double CodedBits(const uint64_t* count, const uint32_t* freq, uint32_t e) {
  double bits = 0;
  for (uint32_t v = 0; v <= e; ++v)
    if (count[v]) bits += static_cast<double>(count[v]) * (kProbBits - std::log2(static_cast<double>(freq[v])));
  return bits;
}

Plan MakePlan(const Stats& s, const EncodeOptions& options) {
  Plan p;
  std::array<std::array<uint64_t, 256>, 5> ge;
  p.escape = ChooseEscape(s, &ge);
  const uint32_t e = p.escape;
  for (uint32_t v = 0; v < e; ++v) p.count[v] = s.win[0][v];
  p.count[e] = ge[0][e];
  for (int k = 0; k < VarintRows(s.max_value); ++k) p.escape_bytes += ge[k][e];
  Normalize(p.count.data(), e + 1, s.n, p.freq.data());
  p.bits = CodedBits(p.count.data(), p.freq.data(), e);
  p.lanes = LanesFor(p.bits, s.n, options);
  return p;
}

StreamStats StatsOf(std::span<const uint32_t> symbols, const SymbolCounts& hist) {
  StreamStats r;
  Stats& s = r.s;
  s.n = symbols.size();
  for (uint32_t v = 0; v < 256; ++v) {
    if (hist[v] == 0) continue;
    if (r.distinct++ == 0) r.lo = v;
    s.max_value = v;
    s.win[0][v] = hist[v];
    if (v >= 128) s.win[1][v - 128] += hist[v];
  }
  if (hist[256]) {
    uint32_t big_lo = UINT32_MAX, big_hi = 0;
    for (uint32_t v : symbols) {
      if (v < 256) continue;
      big_lo = std::min(big_lo, v);
      big_hi = std::max(big_hi, v);
      AddValue(&s, v, 1);
    }
    if (r.distinct++ == 0) r.lo = big_lo;
    if (big_lo != big_hi) ++r.distinct;
    s.max_value = big_hi;
  }
  return r;
}

StreamStats StatsOfHistogram(std::span<const uint64_t> histogram) {
  StreamStats r;
  Stats& s = r.s;
  for (size_t v = 0; v < histogram.size(); ++v) {
    const uint64_t c = histogram[v];
    if (c == 0) continue;
    if (r.distinct++ == 0) r.lo = static_cast<uint32_t>(v);
    s.n += c;
    s.max_value = v;
    if (v < 256) {
      s.win[0][v] += c;
      if (v >= 128) s.win[1][v - 128] += c;
    } else {
      AddValue(&s, v, c);
    }
  }
  return r;
}

SymbolCounts Count(std::span<const uint32_t> symbols) {
  SymbolCounts c{};
  CountSymbols(symbols, c);
  return c;
}

namespace {

// Sums of each symbol's cost cost[base_i + min(v_i, e_i)] into 8 lanes,
// symbol i into lane i % 8 (in order), which TableCosts adds up in lane
// order: the AVX2 form and the scalar one give the same bits. Also the
// escape bytes, and whether any symbol differs from the first.
struct LaneSums {
  double lane[8] = {};
  uint64_t escape_bytes = 0;
  uint32_t differs = 0;
};
void AddCost(LaneSums& s, size_t i, uint32_t v, uint32_t e, int32_t base, const float* cost, uint32_t first) {
  s.differs |= v ^ first;
  if (v >= e) s.escape_bytes += VarintLen(v - e);
  s.lane[i % 8] += static_cast<double>(cost[base + static_cast<int32_t>(std::min(v, e))]);
}
#if defined(__x86_64__)
// 8 symbols at a time where every 8 consecutive symbols keep their table
// positions (one table, or a period that is a multiple of 8): one gather
// of the 8 costs; returns how many symbols it did.
__attribute__((target("avx2"))) size_t AddCostsAvx2(LaneSums& s, std::span<const uint32_t> symbols,
                                                    const int32_t* base, const uint32_t* e_at, size_t period,
                                                    const float* cost, uint32_t first) {
  const size_t n = symbols.size() / 8 * 8;
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  __m256i differs = _mm256_setzero_si256();
  const __m256i f = _mm256_set1_epi32(static_cast<int>(first));
  for (size_t i = 0, p = 0; i < n; i += 8, p = p + 8 >= period ? 0 : p + 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols.data() + i));
    const size_t q = period == 1 ? 0 : p;
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e_at + q));
    const __m256i m = _mm256_min_epu32(v, e);
    differs = _mm256_or_si256(differs, _mm256_xor_si256(v, f));
    if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(m, e))))
      for (size_t j = 0; j < 8; ++j)
        if (symbols[i + j] >= e_at[q + j]) s.escape_bytes += VarintLen(symbols[i + j] - e_at[q + j]);
    const __m256i at = _mm256_add_epi32(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + q)));
    const __m256 c = _mm256_i32gather_ps(cost, at, 4);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(c)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)));
  }
  alignas(32) double l[8];
  _mm256_store_pd(l, lo);
  _mm256_store_pd(l + 4, hi);
  for (int j = 0; j < 8; ++j) s.lane[j] += l[j];
  alignas(32) uint32_t d[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(d), differs);
  for (uint32_t x : d) s.differs |= x;
  return n;
}
#endif

}  // namespace

CycleLayout::CycleLayout(std::span<const CodingTable> tables, std::span<const uint32_t> which)
    : off(tables.size() + 1, 0), base(std::max<size_t>(which.size(), 8)), e_at(base.size()) {
  for (size_t t = 0; t < tables.size(); ++t) off[t + 1] = off[t] + static_cast<int32_t>(tables[t].e + 1);
  for (size_t p = 0; p < base.size(); ++p) {
    base[p] = off[which[p % which.size()]];
    e_at[p] = tables[which[p % which.size()]].e;
  }
}

TableStreamCost CostsWithTables(std::span<const uint32_t> symbols, const CycleTables& ct) {
  TableStreamCost c;
  c.first = symbols[0];
  const size_t period = ct.which.size(), tables = ct.distinct.size();
  // Each distinct table's symbol costs (bits) back to back.
  const CycleLayout at(ct.Coding(), ct.which);
  std::vector<float> cost(static_cast<size_t>(at.off.back()));
  for (size_t t = 0; t < tables; ++t)
    for (uint32_t v = 0; v <= ct.distinct[t]->escape; ++v)
      cost[size_t(at.off[t]) + v] = static_cast<float>(kProbBits - std::log2(double(ct.distinct[t]->freq[v])));
  LaneSums sums;
  size_t done = 0;
#if defined(__x86_64__)
  if ((period == 1 || period % 8 == 0) && simd::Avx2())
    done = AddCostsAvx2(sums, symbols, at.base.data(), at.e_at.data(), period, cost.data(), c.first);
#endif
  for (size_t i = done, p = done % period; i < symbols.size(); ++i, p = p + 1 == period ? 0 : p + 1)
    AddCost(sums, i, symbols[i], at.e_at[p], at.base[p], cost.data(), c.first);
  c.constant = sums.differs == 0;
  c.escape_bytes = sums.escape_bytes;
  for (double lane : sums.lane) c.bits += lane;
  return c;
}

bool SameTable(std::span<const FreqTable* const> cycle) {
  return std::all_of(cycle.begin(), cycle.end(), [&](const FreqTable* t) { return t == cycle[0]; });
}

}  // namespace internal

void CountSymbols(std::span<const uint32_t> symbols, std::span<uint64_t> histogram) {
  // Four interleaved sub-tables of 32-bit counters, flushed before they can
  // overflow; small histograms (the estimates' 1024 bins) stay on the stack.
  constexpr size_t kSub = 4, kStackBins = 1024;
  constexpr size_t kFlush = size_t{1} << 30;
  const size_t bins = histogram.size();
  if (bins == 0) return;
  uint32_t stack[kSub * kStackBins];
  std::vector<uint32_t> heap;
  uint32_t* sub = stack;
  if (bins > kStackBins) {
    heap.resize(kSub * bins);
    sub = heap.data();
  }
  const uint32_t last = static_cast<uint32_t>(std::min<size_t>(bins - 1, UINT32_MAX));
  const uint32_t* v = symbols.data();
  for (size_t done = 0; done < symbols.size();) {
    const size_t n = std::min(symbols.size() - done, kFlush);
    std::memset(sub, 0, kSub * bins * sizeof(uint32_t));
    uint32_t* s0 = sub;
    uint32_t* s1 = sub + bins;
    uint32_t* s2 = sub + 2 * bins;
    uint32_t* s3 = sub + 3 * bins;
    size_t i = 0;
    for (; i + kSub <= n; i += kSub) {
      ++s0[std::min(v[done + i], last)];
      ++s1[std::min(v[done + i + 1], last)];
      ++s2[std::min(v[done + i + 2], last)];
      ++s3[std::min(v[done + i + 3], last)];
    }
    for (; i < n; ++i) ++s0[std::min(v[done + i], last)];
    for (size_t b = 0; b < bins; ++b) histogram[b] += uint64_t{s0[b]} + s1[b] + s2[b] + s3[b];
    done += n;
  }
}

FreqTable MakeFreqTable(std::span<const uint64_t> histogram) {
  using internal::kMaxEscape;
  using internal::kMinEscape;
  size_t top = 0;
  for (size_t v = 0; v < histogram.size(); ++v)
    if (histogram[v]) top = v;
  FreqTable t;
  t.escape = static_cast<uint32_t>(std::clamp<size_t>(top + 1, kMinEscape, kMaxEscape));
  // Counts plus one for every symbol (values >= E on the escape symbol), so
  // that symbols unseen in training still code.
  std::array<uint64_t, kMaxAlphabet> count{};
  uint64_t n = 0;
  for (uint32_t v = 0; v <= t.escape; ++v) count[v] = 1;
  for (size_t v = 0; v < histogram.size(); ++v) count[std::min<size_t>(v, t.escape)] += histogram[v];
  for (uint32_t v = 0; v <= t.escape; ++v) n += count[v];
  internal::Normalize(count.data(), t.escape + 1, n, t.freq.data());
  return t;
}

}  // namespace cachegen::rans
