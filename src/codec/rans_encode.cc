// rANS encoding: EncodeStream and the table forms, all through WriteRans
// (escape split, the scalar and AVX2 encode loops, the stream's bytes).
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "codec/rans.h"
#include "codec/rans_internal.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen::rans {

using internal::CodedBits;
using internal::CodingTable;
using internal::CostsWithTables;
using internal::Count;
using internal::CycleLayout;
using internal::CycleTables;
using internal::kL;
using internal::LanesFor;
using internal::MakePlan;
using internal::Plan;
using internal::SameTable;
using internal::StatsOf;
using internal::StreamStats;
using internal::VarintLen;

namespace {

// Encoder constants of one symbol. The division st / f is done as a multiply
// by a 33-bit magic number: with s = ceil(log2 f) and m = ceil(2^(32+s) / f),
// floor(st * m / 2^(32+s)) = floor(st / f) for every 32-bit st (Granlund and
// Montgomery, "Division by invariant integers using multiplication", Thm 4.2).
// The output is exactly that of the division.
struct EncSymbol {
  uint64_t magic = 0;
  uint32_t shift = 0;
  uint32_t cmpl_freq = 0;     // kProbScale - f
  uint32_t cum = 0;
  uint64_t renorm_bound = 0;  // st >= f << (32 - kProbBits) sheds 16 bits first (2^32, never, when f = 2^12)
};

EncSymbol MakeEncSymbol(uint32_t f, uint32_t cum) {
  EncSymbol e;
  if (f == 0) return e;  // never coded
  uint32_t s = 0;
  while ((1u << s) < f) ++s;
  e.shift = 32 + s;
  e.magic = static_cast<uint64_t>(((static_cast<unsigned __int128>(1) << e.shift) + f - 1) / f);
  e.cmpl_freq = kProbScale - f;
  e.cum = cum;
  e.renorm_bound = uint64_t{f} << (32 - kProbBits);
  return e;
}

#if defined(__x86_64__)
// kPackWords.idx[m]: for a renormalisation mask m over 8 lanes, the lanes
// whose word is emitted, in lane order, in the top popcount(m) of 8 slots:
// a round's words, stored so that they end where the next round's begin.
struct PackWords {
  alignas(32) uint32_t idx[256][8];
};
constexpr PackWords MakePackWords() {
  PackWords t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t k = 8 - static_cast<uint32_t>(std::popcount(m));
    for (uint32_t j = 0; j < 8; ++j)
      if ((m >> j) & 1) t.idx[m][k++] = j;
  }
  return t;
}
constexpr PackWords kPackWords = MakePackWords();

// The 8-lane encode loop over `rounds` full rounds of 8 symbols (symbol 8r + j
// on lane j), last round first, with the lane states x in one AVX2 register:
// the words and states of the scalar loop. Per symbol v of a table at t,
// fc[t + v] = freq | cum << 16 and inv[t + v] = 1.0 / freq (freq < kProbScale). The quotient
// floor(st / f) is taken as floor((st + 0.5) * inv): st / f is k + j / f with
// j < f, so (st + 0.5) / f lies at least 0.5 / f >= 2^-13 from an integer,
// while the double rounding errors stay below 2^-30 (quotients < 2^20).
// Words go below pos (each round stores 8 slots ending at pos, so 8 slots of
// room must be free below); returns the new pos.
// With a table cycle, lane j of round r codes with the table whose entries
// start at base[8 * (r % base_rounds) + j] in fc and inv (the cycle's period
// is 8 * base_rounds; one table: base all 0, base_rounds 1).
__attribute__((target("avx2,bmi2,popcnt"))) size_t EncodeRounds8Avx2(const uint8_t* syms, size_t rounds,
                                                                    const uint32_t* fc, const double* inv,
                                                                    const int32_t* base, size_t base_rounds,
                                                                    uint32_t* state, uint16_t* words, size_t pos) {
  __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state));
  const __m256i lo16 = _mm256_set1_epi32(0xffff);
  const __m256i sign = _mm256_set1_epi32(INT32_MIN);
  const __m256d bias = _mm256_set1_pd(2147483648.0 + 0.5);
  const __m256i scale = _mm256_set1_epi32(kProbScale);
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  size_t b = (rounds - 1) % base_rounds;
  for (size_t r = rounds; r-- > 0; b = b == 0 ? base_rounds - 1 : b - 1) {
    const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(syms + 8 * r));
    const __m256i sym = _mm256_add_epi32(_mm256_cvtepu8_epi32(s8),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 8 * b)));
    const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(fc), sym, 4);
    const __m256i f = _mm256_and_si256(e, lo16);
    const __m256i cum = _mm256_srli_epi32(e, 16);
    // Renormalise: st >= f << 20 (unsigned) sheds its low 16 bits.
    const __m256i bound = _mm256_slli_epi32(f, 32 - kProbBits);
    const __m256i emit = _mm256_cmpeq_epi32(_mm256_max_epu32(x, bound), x);
    const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(emit)));
    const __m256i w = _mm256_permutevar8x32_epi32(
        _mm256_and_si256(x, lo16), _mm256_load_si256(reinterpret_cast<const __m256i*>(kPackWords.idx[m])));
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(words + pos - 8), _mm256_castsi256_si128(w16));
    pos -= static_cast<size_t>(_mm_popcnt_u32(m));
    x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), emit);
    // q = floor(st / f), then st' = st + q * (2^12 - f) + cum.
    const __m256i xs = _mm256_xor_si256(x, sign);  // st - 2^31 as a signed int
    const __m256d d0 = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(xs)), bias);
    const __m256d d1 = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(xs, 1)), bias);
    const __m256d i0 = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), inv, _mm256_castsi256_si128(sym), all, 8);
    const __m256d i1 = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), inv, _mm256_extracti128_si256(sym, 1), all, 8);
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm256_cvttpd_epi32(_mm256_mul_pd(d0, i0))),
                                              _mm256_cvttpd_epi32(_mm256_mul_pd(d1, i1)), 1);
    x = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_mullo_epi32(q, _mm256_sub_epi32(scale, f))), cum);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(state), x);
  return pos;
}
#endif

#if defined(__x86_64__)
// syms[i] = min(symbols[i], e_i) and the escape varints of values >= e_i in
// order, 8 symbols at a time (escapes are rare: a mask test per 8), where
// e_i = e_at[i % period] (period 1 or a multiple of 8). Returns how many
// symbols it did (a multiple of 8).
__attribute__((target("avx2"))) size_t ByteSymbolsAvx2(const uint32_t* symbols, size_t n, const uint32_t* e_at,
                                                       size_t period, uint8_t* syms, ByteWriter& esc) {
  const __m256i one_e = _mm256_set1_epi32(static_cast<int>(e_at[0]));
  const __m256i to_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  size_t i = 0;
  for (size_t p = 0; i + 8 <= n; i += 8, p = p + 8 >= period ? 0 : p + 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    const __m256i ev = period == 1 ? one_e : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e_at + p));
    const __m256i m = _mm256_min_epu32(v, ev);
    const __m256i b = _mm256_shuffle_epi8(m, to_bytes);  // bytes 0-3 of each 128-bit half
    const uint32_t lo = static_cast<uint32_t>(_mm256_cvtsi256_si32(b));
    const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(b, 4));
    std::memcpy(syms + i, &lo, 4);
    std::memcpy(syms + i + 4, &hi, 4);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(m, ev))))
      for (size_t j = 0; j < 8; ++j) {
        const uint32_t e = e_at[period == 1 ? 0 : p + j];
        if (symbols[i + j] >= e) esc.Varint(symbols[i + j] - e);
      }
  }
  return i;
}
#endif

// Writes the rANS body of n >= 1 symbols, symbol i coded with
// tables[which[i % which.size()]] (tables[0] for every symbol when which is
// empty): mode 2 with its (single) table inline, or mode 3 whose tables the
// decoder knows. Returns the header bytes (mode byte on).
size_t WriteRans(std::span<const uint32_t> symbols, std::span<const CodingTable> tables,
                 std::span<const uint32_t> which, uint32_t lanes, uint64_t escape_bytes, bool inline_table,
                 ByteWriter& out) {
  const size_t n = symbols.size();
  const size_t start = out.size();
  const uint32_t only = 0;
  if (which.empty()) which = {&only, 1};
  const size_t period = which.size();
  // The full rounds of 8 lanes go to the AVX2 loop when every lane of a
  // round keeps one table position (one table, or a cycle of a multiple of 8;
  // freq kProbScale, a single symbol, never occurs in a stream of two or more
  // distinct values, but it is checked); the scalar loop takes the rest, last
  // symbols first.
  bool simd = false;
#if defined(__x86_64__)
  simd = lanes == 8 && n >= 8 && (period == 1 || period % 8 == 0) && simd::Avx2();
  for (size_t t = 0; t < tables.size() && simd; ++t)
    for (uint32_t v = 0; v <= tables[t].e && simd; ++v) simd = tables[t].freq[v] < kProbScale;
#endif
  const size_t stop = simd ? n / 8 * 8 : 0;

  // Symbols (values >= E as the escape symbol) and the escape area (forward order).
  std::unique_ptr<uint8_t[]> syms(new uint8_t[n]);
  std::vector<uint8_t> esc;
  esc.reserve(escape_bytes);
  ByteWriter ew(&esc);
  const CycleLayout at(tables, which);
  const std::vector<uint32_t>& e_at = at.e_at;
  size_t done = 0;
#if defined(__x86_64__)
  if (simd) done = ByteSymbolsAvx2(symbols.data(), n, e_at.data(), period, syms.get(), ew);
#endif
  for (size_t i = done, p = done % period; i < n; ++i, p = p + 1 == period ? 0 : p + 1) {
    const uint32_t e = e_at[p];
    syms[i] = static_cast<uint8_t>(std::min(symbols[i], e));
    if (symbols[i] >= e) ew.Varint(symbols[i] - e);
  }

  // Encoder constants of the tables the scalar loop codes with (all of them
  // without AVX2, else those of the last partial round), table t's at
  // enc_at[t]; enc_of[p] for position p.
  std::vector<EncSymbol> encs;
  std::vector<size_t> enc_at(tables.size(), SIZE_MAX);
  std::vector<const EncSymbol*> enc_of(period);
  for (size_t k = 0; k < std::min(n - stop, period); ++k) {  // the positions the scalar loop visits
    const size_t t = which[(stop + k) % period];
    if (enc_at[t] != SIZE_MAX) continue;
    enc_at[t] = encs.size();
    for (uint32_t v = 0, cum = 0; v <= tables[t].e; cum += tables[t].freq[v], ++v)
      encs.push_back(MakeEncSymbol(tables[t].freq[v], cum));
  }
  for (size_t p = 0; p < period; ++p)
    if (enc_at[which[p]] != SIZE_MAX) enc_of[p] = encs.data() + enc_at[which[p]];
  const uint32_t e = tables[which[0]].e;
  const uint32_t* freq = tables[which[0]].freq;

  // Words are produced last to first; they are written from the end of a
  // buffer that fits the most a stream can emit (one per symbol plus the
  // final states) and 8 words of room for the AVX2 rounds' stores, so the
  // payload needs no reversal. Not value-initialised: only [pos, cap) is read.
  const size_t cap = n + 2 * size_t{lanes} + 8;
  std::unique_ptr<uint16_t[]> words(new uint16_t[cap]);
  size_t pos = cap;
  uint32_t x[kMaxLanes];
  for (uint32_t j = 0; j < lanes; ++j) x[j] = kL;
  // Symbol i goes to lane i % lanes and table i % period; both indices are
  // counted down, not divided.
  uint32_t lane = static_cast<uint32_t>((n - 1) % lanes);
  size_t p = (n - 1) % period;
  for (size_t i = n; i-- > stop; lane = lane == 0 ? lanes - 1 : lane - 1, p = p == 0 ? period - 1 : p - 1) {
    uint32_t& st = x[lane];
    const EncSymbol& es = enc_of[p][syms[i]];
    if (st >= es.renorm_bound) {
      words[--pos] = static_cast<uint16_t>(st);
      st >>= 16;
    }
    // st' = (st / f) * 2^12 + st % f + cum  =  st + q * (2^12 - f) + cum.
    const uint32_t q = static_cast<uint32_t>((static_cast<unsigned __int128>(st) * es.magic) >> es.shift);
    st += q * es.cmpl_freq + es.cum;
  }
#if defined(__x86_64__)
  if (stop) {
    // Each table's fc and inv entries back to back (CycleLayout).
    const std::vector<int32_t>& off = at.off;
    std::unique_ptr<uint32_t[]> fc(new uint32_t[size_t(off.back())]);
    std::unique_ptr<double[]> inv(new double[size_t(off.back())]);
    for (size_t t = 0; t < tables.size(); ++t)
      for (uint32_t v = 0, cum = 0; v <= tables[t].e; cum += tables[t].freq[v], ++v) {
        fc[size_t(off[t]) + v] = tables[t].freq[v] | (cum << 16);
        inv[size_t(off[t]) + v] = tables[t].freq[v] ? 1.0 / tables[t].freq[v] : 0.0;
      }
    pos = EncodeRounds8Avx2(syms.get(), stop / 8, fc.get(), inv.get(), at.base.data(), at.base.size() / 8, x,
                            words.get(), pos);
  }
#endif
  for (uint32_t j = lanes; j-- > 0;) {
    words[--pos] = static_cast<uint16_t>(x[j] >> 16);
    words[--pos] = static_cast<uint16_t>(x[j]);
  }
  const size_t nwords = cap - pos;

  if (inline_table) {
    out.U8(kModeRans);
    out.U8(static_cast<uint8_t>(e));
    for (uint32_t v = 0; v <= e; ++v) out.Varint(freq[v]);
  } else {
    out.U8(kModeTable);
  }
  out.U8(static_cast<uint8_t>(lanes));
  out.Varint(esc.size());
  out.Varint(nwords * 2);
  const size_t header = out.size() - start;  // from the mode byte
  out.Bytes(esc);
  static_assert(std::endian::native == std::endian::little, "the payload is copied as little-endian words");
  out.Bytes({reinterpret_cast<const uint8_t*>(words.get() + pos), nwords * 2});
  return header;
}

}  // namespace

size_t EncodeStream(std::span<const uint32_t> symbols, ByteWriter& out, const EncodeOptions& options) {
  return EncodeStream(symbols, Count(symbols), out, options);
}

size_t EncodeStream(std::span<const uint32_t> symbols, const SymbolCounts& counts, ByteWriter& out,
                    const EncodeOptions& options) {
  const size_t n = symbols.size();
  const size_t start = out.size();
  if (n == 0) {
    out.U8(kModeEmpty);
    return 1;
  }
  const StreamStats st = StatsOf(symbols, counts);
  if (st.distinct == 1) {
    out.U8(kModeConstant);
    out.Varint(st.lo);
    return out.size() - start;
  }
  const Plan p = MakePlan(st.s, options);
  const CodingTable table{p.escape, p.freq.data()};
  return WriteRans(symbols, {&table, 1}, {}, p.lanes, p.escape_bytes, /*inline_table=*/true, out);
}

size_t EncodeStreamWithTable(std::span<const uint32_t> symbols, const FreqTable& table, ByteWriter& out,
                             const EncodeOptions& options) {
  const FreqTable* const one[1] = {&table};
  return EncodeStreamWithTables(symbols, one, out, options);
}

size_t EncodeStreamWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                              ByteWriter& out, const EncodeOptions& options, const TableStreamCost* cost) {
  if (SameTable(cycle)) cycle = cycle.first(1);
  const size_t start = out.size();
  if (symbols.empty()) {
    out.U8(kModeEmpty);
    return 1;
  }
  const CycleTables ct(cycle);
  const TableStreamCost c = cost ? *cost : CostsWithTables(symbols, ct);
  if (c.constant) {
    out.U8(kModeConstant);
    out.Varint(symbols[0]);
    return out.size() - start;
  }
  return WriteRans(symbols, ct.Coding(), ct.which, LanesFor(c.bits, symbols.size(), options), c.escape_bytes,
                   /*inline_table=*/false, out);
}

}  // namespace cachegen::rans
