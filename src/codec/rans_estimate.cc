// Size estimates of rANS streams (rate control): the bytes the encoder would
// write, from the model's statistics and plan, without encoding.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>

#include "codec/rans.h"
#include "codec/rans_internal.h"

namespace cachegen::rans {

using internal::CodedBits;
using internal::CostsWithTables;
using internal::Count;
using internal::CycleTables;
using internal::kVarintStep;
using internal::LanesFor;
using internal::MakePlan;
using internal::Plan;
using internal::SameTable;
using internal::Stats;
using internal::StatsOf;
using internal::StatsOfHistogram;
using internal::StreamStats;
using internal::VarintLen;

namespace {

uint64_t TableBytes(const Plan& p) {
  uint64_t b = 1;  // E
  for (uint32_t v = 0; v <= p.escape; ++v) b += VarintLen(p.freq[v]);
  return b;
}

// Multiplies every count by `scale` (rounded): a sample's stats standing for
// the whole stream.
void ScaleStats(Stats* s, double scale) {
  auto sc = [scale](uint64_t c) { return c ? static_cast<uint64_t>(static_cast<double>(c) * scale + 0.5) : 0; };
  s->n = 0;
  for (uint64_t& c : s->win[0]) s->n += (c = sc(c));
  for (uint64_t& c : s->tail) c = sc(c);
  // win[k] counts values from kVarintStep[k] on: empty below max_value.
  for (int k = 1; k < 5 && s->max_value >= kVarintStep[k]; ++k)
    for (uint64_t& c : s->win[k]) c = sc(c);
  s->n += s->tail[0];
}

// Bytes of a rANS stream carrying `bits` of information on `lanes` states:
// mode byte, table, lanes byte, the two lengths, escape area and payload. The
// payload is the information in 16-bit words plus the final states (on
// average about 3 bytes per lane beyond the information they carry).
uint64_t RansStreamBytes(double bits, uint64_t lanes, uint64_t escape_bytes, uint64_t table_bytes) {
  const uint64_t payload = 2 * static_cast<uint64_t>(std::ceil(bits / 16.0)) + 3 * lanes;
  return 1 + table_bytes + 1 + VarintLen(escape_bytes) + VarintLen(payload) + escape_bytes + payload;
}

// EstimateStreamBytes for a non-empty, non-constant stream.
uint64_t EstimateFromStats(const Stats& s, const EncodeOptions& options) {
  const Plan p = MakePlan(s, options);
  return RansStreamBytes(p.bits, p.lanes, p.escape_bytes, TableBytes(p));
}

// Bits of a non-empty stream with these stats coded with `table`.
double TableBits(const Stats& s, const FreqTable& table) {
  const uint32_t e = table.escape;
  std::array<uint64_t, kMaxAlphabet> count{};
  uint64_t direct = 0;
  for (uint32_t v = 0; v < e; ++v) direct += count[v] = s.win[0][v];
  count[e] = s.n - direct;
  return CodedBits(count.data(), table.freq.data(), e);
}

// EstimateStreamBytesWithTable for a non-empty, non-constant stream.
uint64_t EstimateWithTableFromStats(const Stats& s, const FreqTable& table, const EncodeOptions& options) {
  const uint32_t e = table.escape;
  uint64_t escape_bytes = 0;
  // Values >= E + kVarintStep[k] each add a byte to the escape area.
  for (int k = 0; k < 5; ++k) {
    escape_bytes += s.tail[k];
    for (uint32_t j = e; j < 256; ++j) escape_bytes += s.win[k][j];
  }
  const double bits = TableBits(s, table);
  return RansStreamBytes(bits, LanesFor(bits, s.n, options), escape_bytes, /*table_bytes=*/0);
}

}  // namespace

uint64_t EstimateStreamBytes(std::span<const uint32_t> symbols, double scale, const EncodeOptions& options) {
  return EstimateStreamBytes(symbols, Count(symbols), scale, options);
}

uint64_t EstimateStreamBytes(std::span<const uint32_t> symbols, const SymbolCounts& counts, double scale,
                             const EncodeOptions& options) {
  if (symbols.empty()) return 1;
  StreamStats st = StatsOf(symbols, counts);
  if (st.distinct == 1) return 1 + VarintLen(st.lo);
  if (scale != 1) ScaleStats(&st.s, scale);
  return EstimateFromStats(st.s, options);
}

uint64_t EstimateStreamBytes(std::span<const uint64_t> histogram, const EncodeOptions& options) {
  const StreamStats st = StatsOfHistogram(histogram);
  if (st.s.n == 0) return 1;
  if (st.distinct == 1) return 1 + VarintLen(st.lo);
  return EstimateFromStats(st.s, options);
}

TableStreamCost CostWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle) {
  if (symbols.empty()) return {};
  return CostsWithTables(symbols, CycleTables(SameTable(cycle) ? cycle.first(1) : cycle));
}

uint64_t EstimateStreamBytesWithTables(const TableStreamCost& cost, size_t n, const EncodeOptions& options) {
  if (n == 0) return 1;
  if (cost.constant) return 1 + VarintLen(cost.first);
  return RansStreamBytes(cost.bits, LanesFor(cost.bits, n, options), cost.escape_bytes, /*table_bytes=*/0);
}

uint64_t EstimateStreamBytesWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                                       double scale, const EncodeOptions& options) {
  if (SameTable(cycle)) return EstimateStreamBytesWithTable(symbols, *cycle[0], scale, options);
  if (symbols.empty()) return 1;
  const TableStreamCost c = CostsWithTables(symbols, CycleTables(cycle));
  if (c.constant) return 1 + VarintLen(symbols[0]);
  const double bits = c.bits * scale;
  const auto n = static_cast<uint64_t>(double(symbols.size()) * scale + 0.5);
  const auto escape_bytes = static_cast<uint64_t>(double(c.escape_bytes) * scale + 0.5);
  return RansStreamBytes(bits, LanesFor(bits, std::max<uint64_t>(n, 1), options), escape_bytes, /*table_bytes=*/0);
}

uint64_t EstimateStreamBytesWithTable(std::span<const uint64_t> histogram, const FreqTable& table,
                                      const EncodeOptions& options) {
  const StreamStats st = StatsOfHistogram(histogram);
  if (st.s.n == 0) return 1;
  if (st.distinct == 1) return 1 + VarintLen(st.lo);
  return EstimateWithTableFromStats(st.s, table, options);
}

uint64_t EstimateStreamBytesWithTable(std::span<const uint32_t> symbols, const FreqTable& table, double scale,
                                      const EncodeOptions& options) {
  if (symbols.empty()) return 1;
  StreamStats st = StatsOf(symbols, Count(symbols));
  if (st.distinct == 1) return 1 + VarintLen(st.lo);
  if (scale != 1) ScaleStats(&st.s, scale);
  return EstimateWithTableFromStats(st.s, table, options);
}

}  // namespace cachegen::rans
