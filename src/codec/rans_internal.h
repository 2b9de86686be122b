// What the rANS coder's files (rans_*.cc) share beyond rans.h (the contract;
// docs/FORMAT.md "Symbol streams" has the exact byte layout): constants, the
// model's statistics and plan, decode-table building and the decoders' steps.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "codec/rans.h"

namespace cachegen::rans::internal {

// Coder: 32-bit states in [L, 2^32) with L = 2^16, 16-bit renormalisation,
// 12-bit probabilities. Symbol i is coded by lane i % lanes. The encoder runs
// backwards over the symbols and the emitted 16-bit words are reversed, so
// the decoder reads the payload front to back.
//
// Shared: the encoder starts every lane at kL, the parser checks initial
// states against it and the decoders renormalise to it and end on it.
inline constexpr uint32_t kL = 1u << 16;  // lower bound of the state interval
// Shared: Step (below) takes a state's slot with it.
inline constexpr uint32_t kSlotMask = kProbScale - 1;
// Shared: the model chooses the escape threshold within these bounds, the
// parser rejects streams outside them.
inline constexpr uint32_t kMinEscape = 2;
inline constexpr uint32_t kMaxEscape = kMaxAlphabet - 1;  // escape symbol index <= 255

// Escape varints are LEB128: value d costs 1 + [d >= 2^7] + [d >= 2^14] +
// [d >= 2^21] + [d >= 2^28] bytes. So the escape area size for threshold E is
// sum over k of count(values >= E + kVarintStep[k]).
// Shared: the model fills Stats by these steps, the estimates read and scale
// Stats by them.
inline constexpr uint64_t kVarintStep[5] = {0, 1ull << 7, 1ull << 14, 1ull << 21, 1ull << 28};

// Bytes of a varint. Shared: the model, the encoder and the estimates size
// escape areas and tables with it (inline: it runs once per escaped symbol).
inline uint32_t VarintLen(uint64_t v) {
  uint32_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// What both the encoder and the estimator know about a stream before coding
// it, in a form that lets every escape threshold be scored in O(1).
// Shared: built by the model, planned for the encoder, scaled and scored by
// the estimates.
struct Stats {
  uint64_t n = 0;
  uint64_t max_value = 0;
  bool constant = false;  // n > 0 and a single distinct value
  // win[k][j] = count of value kVarintStep[k] + j; tail[k] = count of values
  // >= kVarintStep[k] + 256.
  std::array<std::array<uint64_t, 256>, 5> win{};
  std::array<uint64_t, 5> tail{};
};

// The coding decisions, shared by EncodeStream and EstimateStreamBytes so the
// estimate describes exactly what the encoder writes. Shared: made by the
// model (MakePlan), taken by the encoder and the estimates.
struct Plan {
  uint32_t escape = 0;                      // E; symbol E is the escape symbol
  uint32_t lanes = 1;
  std::array<uint64_t, kMaxAlphabet> count{};  // symbol counts, 0..E
  std::array<uint32_t, kMaxAlphabet> freq{};   // normalised, sum kProbScale
  uint64_t escape_bytes = 0;
  double bits = 0;  // information coded with freq: count[s] * (12 - log2 freq[s]) summed
};

// The model's decisions (rans_model.cc), shared by the encoder and the
// estimates for the reason Plan gives; LanesFor and CodedBits also serve the
// table forms of both.
Plan MakePlan(const Stats& s, const EncodeOptions& options);
// The lane count for a stream of n >= 1 symbols carrying `bits` (EncodeOptions).
uint32_t LanesFor(double bits, uint64_t n, const EncodeOptions& options);
// Information in bits of `count[0..e]` coded with `freq`.
double CodedBits(const uint64_t* count, const uint32_t* freq, uint32_t e);

// Stats of a non-empty stream, with the number of distinct values (counted
// up to 2) and the smallest value.
// Shared: made by the model (rans_model.cc) from symbols for the encoder and
// the estimates, or from a histogram for the estimates.
struct StreamStats {
  Stats s;
  uint32_t distinct = 0;
  uint32_t lo = 0;
};
// From the direct counts of values below 256; the rare larger values (bin
// 256) are looked at one by one.
StreamStats StatsOf(std::span<const uint32_t> symbols, const SymbolCounts& hist);
// Stats of histogram[v] = count of value v, like StatsOf's of the symbols.
StreamStats StatsOfHistogram(std::span<const uint64_t> histogram);
// CountSymbols into a SymbolCounts. Shared: the encoder and the estimates
// count symbols given without counts.
SymbolCounts Count(std::span<const uint32_t> symbols);

// A table WriteRans codes with: escape threshold and freq[0..e].
// Shared: CycleTables::Coding (below) makes them.
struct CodingTable {
  uint32_t e = 0;
  const uint32_t* freq = nullptr;
};

// The distinct tables of a cycle (by address) and, per position, which one.
// Shared: the encoder and the estimates both resolve a cycle this way.
struct CycleTables {
  std::vector<const FreqTable*> distinct;
  std::vector<uint32_t> which;
  explicit CycleTables(std::span<const FreqTable* const> cycle) : which(cycle.size()) {
    for (size_t p = 0; p < cycle.size(); ++p) {
      const auto it = std::find(distinct.begin(), distinct.end(), cycle[p]);
      which[p] = static_cast<uint32_t>(it - distinct.begin());
      if (it == distinct.end()) distinct.push_back(cycle[p]);
    }
  }
  std::vector<CodingTable> Coding() const {
    std::vector<CodingTable> t;
    for (const FreqTable* f : distinct) t.push_back({f->escape, f->freq.data()});
    return t;
  }
};

// Where a cycle's tables lie when each one's E + 1 entries are stored back to
// back (what the AVX2 loops gather from): table t's from off[t] (off[tables]
// = all entries); position p's table at base[p], its escape threshold at
// e_at[p], over max(period, 8) positions (p % period's: one table fills 8).
// Shared: the encoder's rounds and the cost sums.
struct CycleLayout {
  std::vector<int32_t> off, base;
  std::vector<uint32_t> e_at;
  CycleLayout(std::span<const CodingTable> tables, std::span<const uint32_t> which);
};

// CostWithTables (rans.h) of a non-empty stream with the cycle's distinct
// tables. Shared: made by the model (rans_model.cc), so that
// EstimateStreamBytesWithTables decides exactly as the encoder does.
TableStreamCost CostsWithTables(std::span<const uint32_t> symbols, const CycleTables& ct);
// True when every entry of the cycle is the same table: coded as one table.
// Shared: the encoder and the estimates take the one-table path on it.
bool SameTable(std::span<const FreqTable* const> cycle);

// table[cum[v] + k] for k < freq[v], v in [0, e], with the entry layout of
// `form` (rans.h TableForm). Shared: defined with the table builders
// (rans_tables.cc), also used by ParseStream (rans_parse.cc).
void BuildTable(const uint32_t* freq, uint32_t e, uint32_t* table, TableForm form);

// The kCorrupt Status of a malformed stream. Shared: the parser and both
// decoders report with it.
Status Corrupt(const std::string& what);

// The decoders' inner steps. Shared: the parser reads lane states with
// Load16; the inline-table and table-cycle decoders run all three, inline
// because they run once per symbol.
inline uint32_t Load16(const uint8_t* p) {
  uint16_t w;
  std::memcpy(&w, p, 2);
  return w;
}

// One decode step: table lookup, multiply-add; the renormalising read is done
// by the caller. Table entry: symbol (8 bits) | freq-1 (12) | slot-cum (12).
inline uint32_t Step(uint32_t& x, const uint32_t* table) {
  const uint32_t e = table[x & kSlotMask];
  x = (((e >> 8) & 0xfff) + 1) * (x >> kProbBits) + (e >> 20);
  return e & 0xff;
}

// The renormalising read without a branch: always loads the word at pos
// (which must exist) and keeps it only when the state needs it.
__attribute__((always_inline)) inline void RenormUnchecked(uint32_t& x, const uint8_t* wp, size_t& pos) {
  const uint32_t w = Load16(wp + 2 * pos);
  const uint32_t m = 0u - static_cast<uint32_t>(x < kL);
  x = (x << (m & 16)) | (w & m);
  pos += m & 1;
}

// A stream's body words as a block decoder reads them. A block reads a
// fixed number of words whatever it consumes, so a stream is read from its
// payload while a block's reads fit, and from a zero-padded copy of its last
// words after that (made once into *copy: `need` must not grow). A block
// that consumed words past the payload makes the stream corrupt (Overrun).
// Shared: the rANS decoder's lockstep groups and the fused section decoder.
struct PaddedWords {
  const uint8_t* words = nullptr;  // payload body, or its padded copy
  size_t limit = 0;                // payload words at `words`
  size_t pos = 0;                  // next word at `words`
  bool padded = false;
  std::vector<uint8_t>* copy = nullptr;

  void Ensure(size_t need) {
    if (padded || limit - pos >= need) return;
    const size_t rem = limit - pos;
    copy->assign(2 * (rem + need), 0);
    std::memcpy(copy->data(), words + 2 * pos, 2 * rem);
    words = copy->data();
    limit = rem;
    pos = 0;
    padded = true;
  }
  bool Overrun() const { return pos > limit; }
};

}  // namespace cachegen::rans::internal
