// rANS symbol streams: see rans.h for the contract and docs/FORMAT.md ("Symbol streams") for
// the exact byte layout.
//
// Coder: 32-bit states in [L, 2^32) with L = 2^16, 16-bit renormalisation,
// 12-bit probabilities. Symbol i is coded by lane i % lanes. The encoder runs
// backwards over the symbols and the emitted 16-bit words are reversed, so
// the decoder reads the payload front to back.
#include "codec/rans.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "codec/rans_avx2.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen::rans {
namespace {

constexpr uint32_t kL = 1u << 16;            // lower bound of the state interval
constexpr uint32_t kSlotMask = kProbScale - 1;
constexpr uint32_t kMinEscape = 2;
constexpr uint32_t kMaxEscape = kMaxAlphabet - 1;  // escape symbol index <= 255


// Escape varints are LEB128: value d costs 1 + [d >= 2^7] + [d >= 2^14] +
// [d >= 2^21] + [d >= 2^28] bytes. So the escape area size for threshold E is
// sum over k of count(values >= E + kVarintStep[k]).
constexpr uint64_t kVarintStep[5] = {0, 1ull << 7, 1ull << 14, 1ull << 21, 1ull << 28};

uint32_t VarintLen(uint64_t v) {
  uint32_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// What both the encoder and the estimator know about a stream before coding
// it, in a form that lets every escape threshold be scored in O(1).
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
// estimate describes exactly what the encoder writes.
struct Plan {
  uint32_t escape = 0;                      // E; symbol E is the escape symbol
  uint32_t lanes = 1;
  std::array<uint64_t, kMaxAlphabet> count{};  // symbol counts, 0..E
  std::array<uint32_t, kMaxAlphabet> freq{};   // normalised, sum kProbScale
  uint64_t escape_bytes = 0;
  double bits = 0;  // information coded with freq: count[s] * (12 - log2 freq[s]) summed
};

double XLog2X(uint64_t c) { return c == 0 ? 0.0 : static_cast<double>(c) * std::log2(static_cast<double>(c)); }

// Chooses E in [2, min(255, max(2, max_value + 1))] minimising entropy bits
// of the direct+escape symbols plus the escape area plus (roughly) the table.
// How many rows of Stats::win can hold counts: values reach kVarintStep[k]
// only for k below this (the other rows, and their ge, are zero).
int VarintRows(uint64_t max_value) {
  int rows = 1;
  while (rows < 5 && max_value >= kVarintStep[rows]) ++rows;
  return rows;
}

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

// The lane count for a stream of n >= 1 symbols carrying `bits` (EncodeOptions).
uint32_t LanesFor(double bits, uint64_t n, const EncodeOptions& options) {
  if (bits < 8.0 * options.single_lane_below_bytes) return 1;
  return static_cast<uint32_t>(std::min<uint64_t>(std::clamp<uint32_t>(options.lanes, 1, kMaxLanes), n));
}

// Information in bits of `count[0..e]` coded with `freq`.
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

uint64_t TableBytes(const Plan& p) {
  uint64_t b = 1;  // E
  for (uint32_t v = 0; v <= p.escape; ++v) b += VarintLen(p.freq[v]);
  return b;
}

// ---------------------------------------------------------------------------
// Decoding.

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

// Decodes n symbols with N lanes from `words` (nwords 16-bit words, states
// already read). Returns false if the payload runs out or cannot be consumed
// exactly. *used = words read.
//
// Symbols are decoded in blocks of kRounds*N. A block reads at most one word
// per symbol, so while at least kBlock words remain its reads need no bounds
// checks and renormalisation can be branch-free (always load the next word,
// keep it only if needed). When fewer remain, the rest of the payload (fewer
// than kBlock words) is copied into a zero-padded buffer with kBlock words of
// slack, so the same unchecked block code runs on it and one check per block
// catches a payload that ran out. Only the last partial block is decoded with
// per-read checks.
template <uint32_t N>
bool DecodeLanes(uint32_t* state, const uint32_t* table, const uint8_t* words, size_t nwords, uint32_t* out,
                 size_t n, size_t* used) {
  constexpr size_t kRounds = N >= 16 ? 4 : 16;
  constexpr size_t kBlock = kRounds * N;
  uint32_t x[N];
  for (uint32_t j = 0; j < N; ++j) x[j] = state[j];

  auto block = [&](const uint8_t* wp, size_t pos, uint32_t* o) __attribute__((always_inline)) {
    for (size_t r = 0; r < kRounds; ++r, o += N) {
#pragma GCC unroll 32
      for (uint32_t j = 0; j < N; ++j) {
        o[j] = Step(x[j], table);
        // Arithmetic select: compilers tend to turn a ?: here into a
        // (badly predicted) branch.
        RenormUnchecked(x[j], wp, pos);
      }
    }
    return pos;
  };

  size_t pos = 0;
  size_t i = 0;
  while (n - i >= kBlock && nwords - pos >= kBlock) {
    pos = block(words, pos, out + i);
    i += kBlock;
  }
  // At most one word per remaining symbol can still be read.
  const size_t rem = nwords - pos;  // < kBlock here
  if (rem > n - i) return false;
  uint8_t pad[4 * kBlock] = {};
  std::memcpy(pad, words + 2 * pos, 2 * rem);
  size_t p = 0;
  while (n - i >= kBlock) {
    p = block(pad, p, out + i);
    if (p > rem) return false;
    i += kBlock;
  }
  // Tail: i is a multiple of N here, so lane j = i % N restarts at 0.
  uint32_t j = 0;
  for (; i < n; ++i) {
    out[i] = Step(x[j], table);
    if (x[j] < kL) {
      if (p >= rem) return false;
      x[j] = (x[j] << 16) | Load16(pad + 2 * p);
      ++p;
    }
    j = (j + 1 == N) ? 0 : j + 1;
  }
  for (uint32_t k = 0; k < N; ++k) state[k] = x[k];
  *used = pos + p;
  return true;
}

#if defined(__x86_64__)
// kRounds rounds of 8 symbols (one per lane) from words at wp + 2*pos;
// returns the new pos. Reads up to 8 words beyond the last word it consumes.
template <size_t kRounds>
__attribute__((target("avx2,bmi2"), always_inline)) inline size_t Block8Avx2(__m256i& x, const int* tbl,
                                                                             const uint8_t* wp, size_t pos,
                                                                             uint32_t* o) {
  const __m256i sym_mask = _mm256_set1_epi32(0xff);
  for (size_t r = 0; r < kRounds; ++r, o += 8) {
    const __m256i e = avx2::Round8(x, tbl, wp, pos);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_and_si256(e, sym_mask));
  }
  return pos;
}

// DecodeLanes<8> with the 8 lane states in one AVX2 register: a gather for
// the table lookups, and the renormalising reads as one 16-byte load spread
// over the lanes that need a word. Same results, same payload checks: the
// main loop runs while a block's loads (at most kBlock words plus the 8-word
// load width) stay inside the payload; the rest goes through a zero-padded
// copy with one bounds check per block, then a checked scalar tail.
__attribute__((target("avx2,bmi2"))) bool DecodeLanes8Avx2(uint32_t* state, const uint32_t* table,
                                                           const uint8_t* words, size_t nwords, uint32_t* out,
                                                           size_t n, size_t* used) {
  constexpr size_t kRounds = 8;
  constexpr size_t kBlock = kRounds * 8;
  __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state));
  const int* tbl = reinterpret_cast<const int*>(table);


  size_t pos = 0;
  size_t i = 0;
  while (n - i >= kBlock && nwords - pos >= kBlock + 8) {
    pos = Block8Avx2<kRounds>(x, tbl, words, pos, out + i);
    i += kBlock;
  }
  const size_t rem = nwords - pos;  // < kBlock + 8, or fewer than kBlock symbols left
  if (rem > n - i) return false;    // at most one word per remaining symbol
  uint8_t pad[2 * (2 * kBlock + 8)] = {};
  std::memcpy(pad, words + 2 * pos, 2 * rem);
  size_t p = 0;
  while (n - i >= kBlock) {
    p = Block8Avx2<kRounds>(x, tbl, pad, p, out + i);
    if (p > rem) return false;
    i += kBlock;
  }
  alignas(32) uint32_t xs[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(xs), x);
  uint32_t j = 0;
  for (; i < n; ++i) {
    out[i] = Step(xs[j], table);
    if (xs[j] < kL) {
      if (p >= rem) return false;
      xs[j] = (xs[j] << 16) | Load16(pad + 2 * p);
      ++p;
    }
    j = (j + 1 == 8) ? 0 : j + 1;
  }
  for (uint32_t k = 0; k < 8; ++k) state[k] = xs[k];
  *used = pos + p;
  return true;
}
#endif

using DecodeFn = bool (*)(uint32_t*, const uint32_t*, const uint8_t*, size_t, uint32_t*, size_t, size_t*);

template <size_t... I>
constexpr std::array<DecodeFn, sizeof...(I)> MakeDecoders(std::index_sequence<I...>) {
  return {&DecodeLanes<static_cast<uint32_t>(I + 1)>...};
}
constexpr auto kDecoders = MakeDecoders(std::make_index_sequence<kMaxLanes>());

Status Corrupt(const std::string& what) { return Status::Corrupt("rANS stream: " + what); }

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
// the words and states of the scalar loop. Per symbol v, fc[v] = freq |
// cum << 16 and inv[v] = 1.0 / freq (freq < kProbScale). The quotient
// floor(st / f) is taken as floor((st + 0.5) * inv): st / f is k + j / f with
// j < f, so (st + 0.5) / f lies at least 0.5 / f >= 2^-13 from an integer,
// while the double rounding errors stay below 2^-30 (quotients < 2^20).
// Words go below pos (each round stores 8 slots ending at pos, so 8 slots of
// room must be free below); returns the new pos.
__attribute__((target("avx2,bmi2,popcnt"))) size_t EncodeRounds8Avx2(const uint8_t* syms, size_t rounds,
                                                                    const uint32_t* fc, const double* inv,
                                                                    uint32_t* state, uint16_t* words, size_t pos) {
  __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state));
  const __m256i lo16 = _mm256_set1_epi32(0xffff);
  const __m256i sign = _mm256_set1_epi32(INT32_MIN);
  const __m256d bias = _mm256_set1_pd(2147483648.0 + 0.5);
  const __m256i scale = _mm256_set1_epi32(kProbScale);
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  for (size_t r = rounds; r-- > 0;) {
    const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(syms + 8 * r));
    const __m256i sym = _mm256_cvtepu8_epi32(s8);
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
// syms[i] = min(symbols[i], e) and the escape varints of values >= e in
// order, 8 symbols at a time (escapes are rare: a mask test per 8). Returns
// how many symbols it did (a multiple of 8).
__attribute__((target("avx2"))) size_t ByteSymbolsAvx2(const uint32_t* symbols, size_t n, uint32_t e, uint8_t* syms,
                                                       ByteWriter& esc) {
  const __m256i ev = _mm256_set1_epi32(static_cast<int>(e));
  const __m256i to_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    const __m256i m = _mm256_min_epu32(v, ev);
    const __m256i b = _mm256_shuffle_epi8(m, to_bytes);  // bytes 0-3 of each 128-bit half
    const uint32_t lo = static_cast<uint32_t>(_mm256_cvtsi256_si32(b));
    const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(b, 4));
    std::memcpy(syms + i, &lo, 4);
    std::memcpy(syms + i + 4, &hi, 4);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(m, ev))))
      for (size_t j = i; j < i + 8; ++j)
        if (symbols[j] >= e) esc.Varint(symbols[j] - e);
  }
  return i;
}
#endif

// A table WriteRans codes with: escape threshold and freq[0..e].
struct CodingTable {
  uint32_t e = 0;
  const uint32_t* freq = nullptr;
};

// The distinct tables of a cycle (by address) and, per position, which one.
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
  // Symbols (values >= E as the escape symbol) and the escape area (forward order).
  std::unique_ptr<uint8_t[]> syms(new uint8_t[n]);
  std::vector<uint8_t> esc;
  esc.reserve(escape_bytes);
  ByteWriter ew(&esc);
  size_t done = 0;
#if defined(__x86_64__)
  if (period == 1 && simd::Avx2()) done = ByteSymbolsAvx2(symbols.data(), n, tables[which[0]].e, syms.get(), ew);
#endif
  for (size_t i = done, p = done % period; i < n; ++i, p = p + 1 == period ? 0 : p + 1) {
    const uint32_t e = tables[which[p]].e;
    syms[i] = static_cast<uint8_t>(std::min(symbols[i], e));
    if (symbols[i] >= e) ew.Varint(symbols[i] - e);
  }

  // Encoder constants per table; enc_of[p] for position p.
  std::vector<std::array<EncSymbol, kMaxAlphabet>> encs(tables.size());
  for (size_t t = 0; t < tables.size(); ++t)
    for (uint32_t v = 0, cum = 0; v <= tables[t].e; cum += tables[t].freq[v], ++v)
      encs[t][v] = MakeEncSymbol(tables[t].freq[v], cum);
  std::vector<const EncSymbol*> enc_of(period);
  for (size_t p = 0; p < period; ++p) enc_of[p] = encs[which[p]].data();
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
  // The full rounds of 8 lanes go to the AVX2 loop (freq kProbScale, a
  // single symbol, never occurs in a stream of two or more distinct values,
  // but it is checked); the scalar loop takes the rest, last symbols first.
  bool simd = false;
#if defined(__x86_64__)
  simd = period == 1 && lanes == 8 && n >= 8 && simd::Avx2();
  for (uint32_t v = 0; v <= e && simd; ++v) simd = freq[v] < kProbScale;
#endif
  const size_t stop = simd ? n / 8 * 8 : 0;
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
    alignas(32) uint32_t fc[kMaxAlphabet];
    alignas(32) double inv[kMaxAlphabet];
    for (uint32_t v = 0; v <= e; ++v) {
      fc[v] = freq[v] | (enc_of[0][v].cum << 16);
      inv[v] = freq[v] ? 1.0 / freq[v] : 0.0;
    }
    pos = EncodeRounds8Avx2(syms.get(), stop / 8, fc, inv, x, words.get(), pos);
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

// ---------------------------------------------------------------------------

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

namespace {

// Stats of a non-empty stream, with the number of distinct values (counted
// up to 2) and the smallest value.
struct StreamStats {
  Stats s;
  uint32_t distinct = 0;
  uint32_t lo = 0;
};

// From the direct counts of values below 256; the rare larger values (bin
// 256) are looked at one by one.
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

// Stats of histogram[v] = count of value v, like StatsOf's of the symbols.
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

FreqTable MakeFreqTable(std::span<const uint64_t> histogram) {
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
  Normalize(count.data(), t.escape + 1, n, t.freq.data());
  return t;
}

size_t EncodeStreamWithTable(std::span<const uint32_t> symbols, const FreqTable& table, ByteWriter& out,
                             const EncodeOptions& options) {
  const size_t n = symbols.size();
  const size_t start = out.size();
  if (n == 0) {
    out.U8(kModeEmpty);
    return 1;
  }
  const uint32_t e = table.escape;
  uint64_t escape_bytes = 0;
  std::array<uint64_t, kMaxAlphabet> count{};  // of symbols 0..E, values >= E on E
  bool constant = true;
  for (uint32_t v : symbols) {
    constant = constant && v == symbols[0];
    if (v >= e) escape_bytes += VarintLen(v - e);
    ++count[std::min(v, e)];
  }
  if (constant) {
    out.U8(kModeConstant);
    out.Varint(symbols[0]);
    return out.size() - start;
  }
  const uint32_t lanes = LanesFor(CodedBits(count.data(), table.freq.data(), e), n, options);
  const CodingTable t{table.escape, table.freq.data()};
  return WriteRans(symbols, {&t, 1}, {}, lanes, escape_bytes, /*inline_table=*/false, out);
}

namespace {

// What EncodeStreamWithTables decides from a non-empty stream's symbols:
// constant or not, the escape area and the coded information.
struct CycleCosts {
  bool constant = true;
  uint64_t escape_bytes = 0;
  double bits = 0;
};

CycleCosts CostsWithTables(std::span<const uint32_t> symbols, const CycleTables& ct) {
  CycleCosts c;
  const size_t period = ct.which.size();
  std::vector<std::array<uint64_t, kMaxAlphabet>> count(ct.distinct.size());
  for (size_t i = 0, p = 0; i < symbols.size(); ++i, p = p + 1 == period ? 0 : p + 1) {
    const uint32_t v = symbols[i], t = ct.which[p], e = ct.distinct[t]->escape;
    c.constant = c.constant && v == symbols[0];
    if (v >= e) c.escape_bytes += VarintLen(v - e);
    ++count[t][std::min(v, e)];
  }
  for (size_t t = 0; t < ct.distinct.size(); ++t)
    c.bits += CodedBits(count[t].data(), ct.distinct[t]->freq.data(), ct.distinct[t]->escape);
  return c;
}

bool SameTable(std::span<const FreqTable* const> cycle) {
  return std::all_of(cycle.begin(), cycle.end(), [&](const FreqTable* t) { return t == cycle[0]; });
}

}  // namespace

size_t EncodeStreamWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                              ByteWriter& out, const EncodeOptions& options) {
  if (SameTable(cycle)) return EncodeStreamWithTable(symbols, *cycle[0], out, options);
  const size_t start = out.size();
  if (symbols.empty()) {
    out.U8(kModeEmpty);
    return 1;
  }
  const CycleTables ct(cycle);
  const CycleCosts c = CostsWithTables(symbols, ct);
  if (c.constant) {
    out.U8(kModeConstant);
    out.Varint(symbols[0]);
    return out.size() - start;
  }
  return WriteRans(symbols, ct.Coding(), ct.which, LanesFor(c.bits, symbols.size(), options), c.escape_bytes,
                   /*inline_table=*/false, out);
}

uint64_t EstimateStreamBytesWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                                       double scale, const EncodeOptions& options) {
  if (SameTable(cycle)) return EstimateStreamBytesWithTable(symbols, *cycle[0], scale, options);
  if (symbols.empty()) return 1;
  const CycleCosts c = CostsWithTables(symbols, CycleTables(cycle));
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

namespace {

// table[cum[v] + k] = Entry(v) + (k << shift) for k < freq[v] (symbols with
// frequency 0 take no slots; freq sums to kProbScale), with the entry layout
// of `form` (rans.h TableForm).
struct EntryLayout {
  uint32_t shift;  // where the slot offset k goes
  uint32_t Entry(uint32_t v, uint32_t f, uint32_t e, bool values) const {
    if (!values) return v | ((f - 1) << 8);
    // ZigZag-decoded value of a direct symbol (v < e <= 255: in [-127, 127]);
    // the escape symbol is marked -128.
    const int32_t q = v == e ? -128 : static_cast<int32_t>(v >> 1) ^ -static_cast<int32_t>(v & 1);
    return ((f - 1) << 12) | (static_cast<uint32_t>(q) << 24);
  }
};

void BuildTableScalar(const uint32_t* freq, uint32_t e, uint32_t* table, TableForm form) {
  const bool values = form == TableForm::kZigZagValues;
  const EntryLayout lay{values ? 0u : 20u};
  uint32_t cum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint32_t base = lay.Entry(v, freq[v], e, values);
    for (uint32_t k = 0; k < freq[v]; ++k) table[cum + k] = base + (k << lay.shift);
    cum += freq[v];
  }
}

#if defined(__x86_64__)
// The same entries, eight per store.
__attribute__((target("avx2"))) void BuildTableAvx2(const uint32_t* freq, uint32_t e, uint32_t* table,
                                                   TableForm form) {
  const bool values = form == TableForm::kZigZagValues;
  const EntryLayout lay{values ? 0u : 20u};
  const int sh = static_cast<int>(lay.shift);
  const __m256i iota = _mm256_setr_epi32(0, 1 << sh, 2 << sh, 3 << sh, 4 << sh, 5 << sh, 6 << sh, 7 << sh);
  const __m256i step = _mm256_set1_epi32(8 << sh);
  uint32_t cum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint32_t f = freq[v];
    const uint32_t base = lay.Entry(v, f, e, values);
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), iota);
    uint32_t k = 0;
    for (; k + 8 <= f; k += 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(table + cum + k), x);
      x = _mm256_add_epi32(x, step);
    }
    for (; k < f; ++k) table[cum + k] = base + (k << lay.shift);
    cum += f;
  }
}
#endif

void BuildTable(const uint32_t* freq, uint32_t e, uint32_t* table, TableForm form) {
#if defined(__x86_64__)
  if (simd::Avx2()) return BuildTableAvx2(freq, e, table, form);
#endif
  BuildTableScalar(freq, e, table, form);
}

}  // namespace

namespace {
Status ParseLanesAndAreas(ByteReader& in, size_t n, StreamHeader* s);
}  // namespace

Status ParseStreamHeader(ByteReader& in, size_t n, StreamHeader* s) {
  s->mode = in.U8();
  if (!in.ok()) return Corrupt("truncated before mode byte");
  if (s->mode == kModeEmpty) {
    if (n != 0) return Corrupt("stream is empty but " + std::to_string(n) + " symbols were expected");
    return Status::Ok();
  }
  if (s->mode == kModeConstant) {
    const uint64_t v = in.Varint();
    if (!in.ok()) return Corrupt("truncated constant value");
    if (v > UINT32_MAX) return Corrupt("constant value exceeds 32 bits");
    s->constant = static_cast<uint32_t>(v);
    return Status::Ok();
  }
  if (s->mode != kModeRans) return Corrupt("unknown mode " + std::to_string(s->mode));

  const uint32_t e = in.U8();
  if (!in.ok()) return Corrupt("truncated escape threshold");
  if (e < kMinEscape || e > kMaxEscape) return Corrupt("escape threshold " + std::to_string(e) + " outside [2, 255]");
  uint64_t sum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint64_t f = in.Varint();
    if (!in.ok()) return Corrupt("truncated frequency table");
    if (f > kProbScale) return Corrupt("frequency " + std::to_string(f) + " exceeds 4096");
    s->freq[v] = static_cast<uint32_t>(f);
    sum += f;
  }
  if (sum != kProbScale) return Corrupt("frequency table sums to " + std::to_string(sum) + ", expected 4096");
  CG_RETURN_IF_ERROR(ParseLanesAndAreas(in, n, s));
  if (!s->esc.empty() && s->freq[e] == 0) return Corrupt("escape bytes present but the escape symbol has frequency 0");
  s->escape = e;
  s->escape_used = s->freq[e] > 0;
  return Status::Ok();
}

namespace {

// The part of a mode 2 or 3 stream after its table: lanes, lengths, escape
// area, payload; the initial lane states are checked.
Status ParseLanesAndAreas(ByteReader& in, size_t n, StreamHeader* s) {
  const uint32_t lanes = in.U8();
  const uint64_t esc_len = in.Varint();
  const uint64_t payload_len = in.Varint();
  if (!in.ok()) return Corrupt("truncated stream header");
  if (lanes < 1 || lanes > kMaxLanes) return Corrupt("lane count " + std::to_string(lanes) + " outside [1, 32]");
  if (payload_len % 2 != 0) return Corrupt("odd payload length");
  const uint64_t nwords = payload_len / 2;
  // Every symbol reads at most one word, plus two per lane for the states;
  // more could never be consumed.
  if (nwords < 2ull * lanes || nwords - 2ull * lanes > n) {
    return Corrupt("payload of " + std::to_string(payload_len) + " bytes is inconsistent with " + std::to_string(n) +
                   " symbols and " + std::to_string(lanes) + " lanes");
  }
  // Each escape varint is at most 5 bytes (values are 32-bit).
  if (esc_len > 5ull * n) return Corrupt("escape area longer than the symbols could need");
  s->lanes = lanes;
  s->esc = in.Bytes(esc_len);
  s->payload = in.Bytes(payload_len);
  if (!in.ok()) return Corrupt("truncated escape area or payload");
  for (uint32_t j = 0; j < lanes; ++j) {
    const uint32_t x = Load16(s->payload.data() + 4 * j) | (Load16(s->payload.data() + 4 * j + 2) << 16);
    if (x < kL) return Corrupt("initial state of lane " + std::to_string(j) + " below 2^16");
  }
  return Status::Ok();
}

}  // namespace

Status ParseStream(ByteReader& in, size_t n, ParsedStream* s, TableForm form) {
  StreamHeader h;
  s->n = n;
  s->form = form;
  CG_RETURN_IF_ERROR(ParseStreamHeader(in, n, &h));
  s->mode = h.mode;
  s->constant = h.constant;
  if (h.mode != kModeRans) return Status::Ok();
  s->escape = h.escape;
  s->escape_used = h.escape_used;
  s->lanes = h.lanes;
  s->esc = h.esc;
  s->payload = h.payload;
  BuildTable(h.freq.data(), h.escape, s->table, form);
  for (uint32_t j = 0; j < h.lanes; ++j)
    s->state[j] = Load16(s->payload.data() + 4 * j) | (Load16(s->payload.data() + 4 * j + 2) << 16);
  return Status::Ok();
}

namespace {

// Replaces each escape symbol e in out[i0, i1) by e + the next varint of er.
// False when er runs out or a value would exceed 32 bits.
bool PatchEscapes(uint32_t e, uint32_t* out, size_t i0, size_t i1, ByteReader& er) {
  constexpr size_t kScan = 32;
  for (; i0 < i1; i0 += kScan) {
    const size_t end = std::min(i1, i0 + kScan);
    bool any = false;  // branch-free scan first: escapes are rare
    for (size_t i = i0; i < end; ++i) any |= out[i] == e;
    if (!any) continue;
    for (size_t i = i0; i < end; ++i) {
      if (out[i] != e) continue;
      const uint64_t d = er.Varint();
      if (!er.ok() || d > UINT32_MAX - e) return false;
      out[i] = static_cast<uint32_t>(e + d);
    }
  }
  return true;
}

#if defined(__x86_64__)
// PatchEscapes over 32 symbols per test.
__attribute__((target("avx2"))) bool PatchEscapesAvx2(uint32_t e, uint32_t* out, size_t n, ByteReader& er) {
  const __m256i ev = _mm256_set1_epi32(static_cast<int>(e));
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i* p = reinterpret_cast<const __m256i*>(out + i);
    const __m256i hit = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_loadu_si256(p), ev), _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 1), ev)),
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_loadu_si256(p + 2), ev),
                        _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 3), ev)));
    if (_mm256_testz_si256(hit, hit)) continue;
    if (!PatchEscapes(e, out, i, i + 32, er)) return false;
  }
  return PatchEscapes(e, out, i, n, er);
}
#endif

// After the rANS body: the final-state check and the escape values.
Status FinishStream(const ParsedStream& s, size_t used, uint32_t* out) {
  const size_t body_words = s.payload.size() / 2 - 2 * s.lanes;
  if (used != body_words) return Corrupt("payload has unread words after the last symbol");
  for (uint32_t j = 0; j < s.lanes; ++j) {
    if (s.state[j] != kL) return Corrupt("final state of lane " + std::to_string(j) + " is not the initial value");
  }
  if (!s.escape_used) return Status::Ok();
  ByteReader er(s.esc);
#if defined(__x86_64__)
  if (simd::Avx2()) {
    if (!PatchEscapesAvx2(s.escape, out, s.n, er)) return Corrupt("escape area exhausted or out of range");
  } else
#endif
  if (!PatchEscapes(s.escape, out, 0, s.n, er)) {
    return Corrupt("escape area exhausted or out of range");
  }
  if (er.remaining() != 0) return Corrupt("escape area has unread bytes");
  return Status::Ok();
}

const uint8_t* Body(const ParsedStream& s) { return s.payload.data() + 4 * s.lanes; }
size_t BodyWords(const ParsedStream& s) { return s.payload.size() / 2 - 2 * s.lanes; }

Status DecodeOne(ParsedStream& s, uint32_t* out, size_t done_symbols, size_t done_words) {
  if (s.mode == kModeEmpty) return Status::Ok();
  if (s.mode == kModeConstant) {
    std::fill(out, out + s.n, s.constant);
    return Status::Ok();
  }
  DecodeFn decode = kDecoders[s.lanes - 1];
#if defined(__x86_64__)
  if (s.lanes == 8 && simd::Avx2()) decode = &DecodeLanes8Avx2;
#endif
  size_t used = 0;
  if (!decode(s.state, s.table, Body(s) + 2 * done_words, BodyWords(s) - done_words, out + done_symbols,
              s.n - done_symbols, &used)) {
    return Corrupt("payload length does not match the coded symbols");
  }
  return FinishStream(s, done_words + used, out);
}

// K one-lane streams decoded in lockstep. A one-lane stream is a single chain
// of dependent table lookups and multiplies; interleaving independent streams
// fills the pipeline as lanes do within a stream. Runs while every stream has
// words left for a whole block of symbols (at most one word each, so reads
// need no checks), then leaves the rest to DecodeOne.
template <int K>
void DecodeGroupOneLane(ParsedStream* const* s, uint32_t* const* o, size_t* done_syms, size_t* done_words) {
  constexpr size_t kBlockSymbols = 16;
  uint32_t x[K];
  size_t pos[K], nw[K];
  const uint32_t* tbl[K];
  const uint8_t* body[K];
  uint32_t* out[K];
  size_t n = s[0]->n;
  for (int k = 0; k < K; ++k) {
    x[k] = s[k]->state[0];
    pos[k] = 0;
    nw[k] = BodyWords(*s[k]);
    tbl[k] = s[k]->table;
    body[k] = Body(*s[k]);
    out[k] = o[k];
    n = std::min(n, s[k]->n);
  }
  size_t i = 0;
  for (;;) {
    size_t count = n - i;
    for (int k = 0; k < K; ++k) count = std::min(count, nw[k] - pos[k]);
    if (count < kBlockSymbols) break;
    for (const size_t end = i + count; i < end; ++i) {
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) {
        out[k][i] = Step(x[k], tbl[k]);
        RenormUnchecked(x[k], body[k], pos[k]);
      }
    }
  }
  for (int k = 0; k < K; ++k) {
    s[k]->state[0] = x[k];
    done_syms[k] = i;
    done_words[k] = pos[k];
  }
}

#if defined(__x86_64__)
// K 8-lane streams decoded in lockstep, so that one stream's table gathers
// and multiplies overlap the others': the single-stream loop is bound by that
// dependency chain, not by throughput. Runs whole rounds while every stream
// is in its unchecked region, then leaves the rest to DecodeOne.
template <int K>
__attribute__((target("avx2,bmi2"))) void DecodeGroupAvx2(ParsedStream* const* s, uint32_t* const* o,
                                                         size_t* done_syms, size_t* done_words) {
  // Everything a round needs in locals: the output stores could alias the
  // ParsedStream fields, which would otherwise be reloaded every round.
  __m256i x[K];
  size_t pos[K], nw[K];
  const int* tbl[K];
  const uint8_t* body[K];
  uint32_t* out[K];
  size_t n = s[0]->n;
  for (int k = 0; k < K; ++k) {
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s[k]->state));
    pos[k] = 0;
    nw[k] = BodyWords(*s[k]);
    tbl[k] = reinterpret_cast<const int*>(s[k]->table);
    body[k] = Body(*s[k]);
    out[k] = o[k];
    n = std::min(n, s[k]->n);
  }
  size_t i = 0;
  for (;;) {
    // A round reads 8 words at pos and consumes at most 8: `rounds` more
    // rounds stay inside every payload while each has >= 8 * rounds + 8 words left.
    size_t rounds = (n - i) / 8;
    for (int k = 0; k < K; ++k) rounds = std::min(rounds, nw[k] - pos[k] >= 16 ? (nw[k] - pos[k] - 8) / 8 : 0);
    if (rounds == 0) break;
    for (size_t r = 0; r < rounds; ++r, i += 8) {
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) pos[k] = Block8Avx2<1>(x[k], tbl[k], body[k], pos[k], out[k] + i);
    }
  }
  for (int k = 0; k < K; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s[k]->state), x[k]);
    done_syms[k] = i;
    done_words[k] = pos[k];
  }
}
#endif

// The lockstep group decoders, by group size K (8, 4 or 2).
struct OneLaneGroups {
  template <int K>
  static void Decode(ParsedStream* const* s, uint32_t* const* o, size_t* syms, size_t* words) {
    DecodeGroupOneLane<K>(s, o, syms, words);
  }
};
#if defined(__x86_64__)
struct Avx2Groups {
  template <int K>
  static void Decode(ParsedStream* const* s, uint32_t* const* o, size_t* syms, size_t* words) {
    DecodeGroupAvx2<K>(s, o, syms, words);
  }
};
#endif

// Streams waiting to be decoded in lockstep groups of at most kMax (8 or 4)
// by Groups; each group decodes a prefix of its streams and leaves the rest
// (and the end checks) to DecodeOne.
template <class Groups, size_t kMax>
class PendingStreams {
 public:
  Status Add(ParsedStream* s, uint32_t* o) {
    s_[n_] = s;
    o_[n_] = o;
    return ++n_ == kMax ? Flush() : Status::Ok();
  }
  // Groups of 8 (if kMax allows), 4 and 2, then a last stream alone.
  Status Flush() {
    size_t off = 0;
    if constexpr (kMax >= 8) CG_RETURN_IF_ERROR(Take<8>(&off));
    CG_RETURN_IF_ERROR(Take<4>(&off));
    CG_RETURN_IF_ERROR(Take<2>(&off));
    if (n_ - off == 1) CG_RETURN_IF_ERROR(DecodeOne(*s_[off], o_[off], 0, 0));
    n_ = 0;
    return Status::Ok();
  }

 private:
  template <int K>
  Status Take(size_t* off) {
    if (n_ - *off < K) return Status::Ok();
    size_t syms[K], words[K];
    Groups::template Decode<K>(s_ + *off, o_ + *off, syms, words);
    for (int k = 0; k < K; ++k) CG_RETURN_IF_ERROR(DecodeOne(*s_[*off + k], o_[*off + k], syms[k], words[k]));
    *off += K;
    return Status::Ok();
  }

  ParsedStream* s_[kMax];
  uint32_t* o_[kMax];
  size_t n_ = 0;
};

}  // namespace

Status DecodeParsed(std::span<ParsedStream* const> streams, std::span<uint32_t* const> outs) {
  for (const ParsedStream* s : streams)
    if (s->form != TableForm::kSymbols) return Status::Internal("rANS stream: table form DecodeParsed cannot decode");
  // One-lane streams (the encoder's choice for short ones, FORMAT.md) run in
  // lockstep groups of 4: groups of 8 measured no faster (rans_bench.cc,
  // DecodeStreams).
  PendingStreams<OneLaneGroups, 4> one_lane;
#if defined(__x86_64__)
  // 8-lane rANS streams run in lockstep groups of 8 (then 4, 2) streams:
  // measured 2, 4, 8 streams gave 510, 770, 850 M symbols/s.
  PendingStreams<Avx2Groups, 8> lanes8;
  const bool avx2 = simd::Avx2();
#endif
  for (size_t k = 0; k < streams.size(); ++k) {
    ParsedStream& s = *streams[k];
    const bool rans = s.mode == kModeRans;
#if defined(__x86_64__)
    if (avx2 && rans && s.lanes == 8) {
      CG_RETURN_IF_ERROR(lanes8.Add(&s, outs[k]));
      continue;
    }
#endif
    if (rans && s.lanes == 1) {
      CG_RETURN_IF_ERROR(one_lane.Add(&s, outs[k]));
      continue;
    }
    CG_RETURN_IF_ERROR(DecodeOne(s, outs[k], 0, 0));
  }
#if defined(__x86_64__)
  CG_RETURN_IF_ERROR(lanes8.Flush());
#endif
  return one_lane.Flush();
}

void BuildDecodeTable(const FreqTable& table, DecodeTable* out) {
  BuildTable(table.freq.data(), table.escape, out->entry, TableForm::kSymbols);
  out->escape = table.escape;
}

void BuildValueTable(const FreqTable& table, uint32_t* entries) {
  BuildTable(table.freq.data(), table.escape, entries, TableForm::kZigZagValues);
}

Status ParseStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out,
                             TableStream* s) {
  s->n = out.size();
  s->out = out.data();
  s->cycle = cycle;
  if (cycle.empty()) return Status::Internal("rANS stream: empty table cycle");
  ByteReader peek = in;
  const uint8_t mode = peek.U8();
  if (peek.ok() && mode == kModeRans) return Corrupt("a table-form stream was expected");
  StreamHeader h;
  if (!peek.ok() || mode != kModeTable) {
    // Modes 0 and 1 (and the errors of every other).
    CG_RETURN_IF_ERROR(ParseStreamHeader(in, s->n, &h));
  } else {
    in = peek;
    h.mode = kModeTable;
    CG_RETURN_IF_ERROR(ParseLanesAndAreas(in, s->n, &h));
  }
  s->mode = h.mode;
  s->constant = h.constant;
  s->lanes = h.lanes;
  s->esc = h.esc;
  s->payload = h.payload;
  for (uint32_t j = 0; j < h.lanes; ++j)
    s->state[j] = Load16(h.payload.data() + 4 * j) | (Load16(h.payload.data() + 4 * j + 2) << 16);
  return Status::Ok();
}

namespace {

const uint8_t* Body(const TableStream& s) { return s.payload.data() + 4 * s.lanes; }
size_t BodyWords(const TableStream& s) { return s.payload.size() / 2 - 2 * s.lanes; }

// Decodes a table-form stream's symbols [done, n) one at a time, from the
// states in s.state and body word `pos` on, after reading the escapes of the
// symbols [0, done) a group decoder left as escape symbols (escape values
// are in symbol order); then the end checks. done is a multiple of the lanes.
Status FinishTableStream(TableStream& s, size_t done, size_t pos) {
  const size_t n = s.n, period = s.cycle.size(), nwords = BodyWords(s);
  const uint8_t* body = Body(s);
  uint32_t* out = s.out;
  uint32_t* x = s.state;
  ByteReader er(s.esc);
  for (size_t i = 0, p = 0; i < done; ++i, p = p + 1 == period ? 0 : p + 1) {
    if (out[i] != s.cycle[p]->escape) continue;
    const uint64_t d = er.Varint();
    if (!er.ok() || d > UINT32_MAX - out[i]) return Corrupt("escape area exhausted or out of range");
    out[i] += static_cast<uint32_t>(d);
  }
  // One symbol at a time: each may use another table and escape threshold,
  // and escapes are read as they are decoded.
  for (size_t i = done, j = 0, p = done % period; i < n;
       ++i, j = j + 1 == s.lanes ? 0 : j + 1, p = p + 1 == period ? 0 : p + 1) {
    const DecodeTable& t = *s.cycle[p];
    uint32_t v = Step(x[j], t.entry);
    if (x[j] < kL) {
      if (pos >= nwords) return Corrupt("payload length does not match the coded symbols");
      x[j] = (x[j] << 16) | Load16(body + 2 * pos++);
    }
    if (v == t.escape) {
      const uint64_t d = er.Varint();
      if (!er.ok() || d > UINT32_MAX - v) return Corrupt("escape area exhausted or out of range");
      v += static_cast<uint32_t>(d);
    }
    out[i] = v;
  }
  if (pos != nwords) return Corrupt("payload has unread words after the last symbol");
  for (uint32_t j = 0; j < s.lanes; ++j)
    if (x[j] != kL) return Corrupt("final state of lane " + std::to_string(j) + " is not the initial value");
  if (er.remaining() != 0) return Corrupt("escape area has unread bytes");
  return Status::Ok();
}

// K one-lane table-form streams of equal length and period in lockstep
// (DecodeGroupOneLane with a table per symbol): runs while every stream has
// words left for a whole block, leaving escape symbols for FinishTableStream.
template <int K>
void CycleGroupOneLane(TableStream* const* s, size_t* done, size_t* words) {
  constexpr size_t kBlockSymbols = 16;
  uint32_t x[K];
  size_t pos[K], nw[K];
  const DecodeTable* const* cyc[K];
  const uint8_t* body[K];
  uint32_t* out[K];
  const size_t n = s[0]->n, period = s[0]->cycle.size();
  for (int k = 0; k < K; ++k) {
    x[k] = s[k]->state[0];
    pos[k] = 0;
    nw[k] = BodyWords(*s[k]);
    cyc[k] = s[k]->cycle.data();
    body[k] = Body(*s[k]);
    out[k] = s[k]->out;
  }
  size_t i = 0, p = 0;
  for (;;) {
    size_t count = n - i;
    for (int k = 0; k < K; ++k) count = std::min(count, nw[k] - pos[k]);
    if (count < kBlockSymbols) break;
    for (const size_t end = i + count; i < end; ++i, p = p + 1 == period ? 0 : p + 1) {
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        out[k][i] = Step(x[k], cyc[k][p]->entry);
        RenormUnchecked(x[k], body[k], pos[k]);
      }
    }
  }
  for (int k = 0; k < K; ++k) {
    s[k]->state[0] = x[k];
    done[k] = i;
    words[k] = pos[k];
  }
}

#if defined(__x86_64__)
// K 8-lane streams of equal length whose (equal) period is a multiple of 8
// in lockstep, whole rounds in AVX2 with a table per lane (symbol 8r + j, on
// lane j, uses cycle[(8r + j) % period], so a round's tables are 8
// consecutive cycle entries), while every round's 8-word read stays inside
// every payload. Escapes stay escape symbols.
template <int K>
__attribute__((target("avx2,bmi2"))) void CycleGroup8Avx2(TableStream* const* s, size_t* done, size_t* words) {
  __m256i x[K];
  size_t pos[K], nw[K];
  const DecodeTable* const* cyc[K];
  const uint8_t* body[K];
  uint32_t* out[K];
  const size_t n = s[0]->n, period = s[0]->cycle.size();
  for (int k = 0; k < K; ++k) {
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s[k]->state));
    pos[k] = 0;
    nw[k] = BodyWords(*s[k]);
    cyc[k] = s[k]->cycle.data();
    body[k] = Body(*s[k]);
    out[k] = s[k]->out;
  }
  const __m256i sym_mask = _mm256_set1_epi32(0xff);
  size_t i = 0, p = 0;
  for (;;) {
    size_t rounds = (n - i) / 8;
    for (int k = 0; k < K; ++k) rounds = std::min(rounds, (nw[k] - pos[k]) / 8);
    if (rounds == 0) break;
    for (size_t r = 0; r < rounds; ++r, i += 8, p = p + 8 == period ? 0 : p + 8) {
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const __m256i e = avx2::Round8Tables(x[k], cyc[k] + p, body[k], pos[k]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[k] + i), _mm256_and_si256(e, sym_mask));
      }
    }
  }
  for (int k = 0; k < K; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s[k]->state), x[k]);
    done[k] = i;
    words[k] = pos[k];
  }
}
#endif

// Table-form streams of one shape (lanes, length, period) waiting to be
// decoded in lockstep groups of 4, 2 and 1 by Group<K>, each finished alone.
template <template <int> class Group>
class PendingTableStreams {
 public:
  Status Add(TableStream* s) {
    if (n_ > 0 && (s->n != s_[0]->n || s->cycle.size() != s_[0]->cycle.size())) CG_RETURN_IF_ERROR(Flush());
    s_[n_++] = s;
    return n_ == 4 ? Flush() : Status::Ok();
  }
  Status Flush() {
    size_t off = 0;
    CG_RETURN_IF_ERROR(Take<4>(&off));
    CG_RETURN_IF_ERROR(Take<2>(&off));
    CG_RETURN_IF_ERROR(Take<1>(&off));
    n_ = 0;
    return Status::Ok();
  }

 private:
  template <int K>
  Status Take(size_t* off) {
    if (n_ - *off < K) return Status::Ok();
    size_t done[K], words[K];
    Group<K>::Decode(s_ + *off, done, words);
    for (int k = 0; k < K; ++k) CG_RETURN_IF_ERROR(FinishTableStream(*s_[*off + k], done[k], words[k]));
    *off += K;
    return Status::Ok();
  }

  TableStream* s_[4];
  size_t n_ = 0;
};

template <int K>
struct OneLaneCycles {
  static void Decode(TableStream* const* s, size_t* done, size_t* words) { CycleGroupOneLane<K>(s, done, words); }
};
#if defined(__x86_64__)
template <int K>
struct Avx2Cycles {
  static void Decode(TableStream* const* s, size_t* done, size_t* words) { CycleGroup8Avx2<K>(s, done, words); }
};
#endif

}  // namespace

Status DecodeStreamsWithTables(std::span<TableStream* const> streams) {
  // Streams of one length and period next to each other (a section's anchor
  // and delta streams alternate), so they can share groups.
  std::vector<TableStream*> order(streams.begin(), streams.end());
  std::stable_sort(order.begin(), order.end(), [](const TableStream* a, const TableStream* b) {
    return std::pair(a->n, a->cycle.size()) < std::pair(b->n, b->cycle.size());
  });
  PendingTableStreams<OneLaneCycles> one_lane;
#if defined(__x86_64__)
  PendingTableStreams<Avx2Cycles> lanes8;
  const bool avx2 = simd::Avx2();
#endif
  for (TableStream* s : order) {
    if (s->mode == kModeEmpty) continue;
    if (s->mode == kModeConstant) {
      std::fill(s->out, s->out + s->n, s->constant);
      continue;
    }
#if defined(__x86_64__)
    if (avx2 && s->lanes == 8 && s->cycle.size() % 8 == 0) {
      CG_RETURN_IF_ERROR(lanes8.Add(s));
      continue;
    }
#endif
    if (s->lanes == 1) {
      CG_RETURN_IF_ERROR(one_lane.Add(s));
      continue;
    }
    CG_RETURN_IF_ERROR(FinishTableStream(*s, 0, 0));
  }
#if defined(__x86_64__)
  CG_RETURN_IF_ERROR(lanes8.Flush());
#endif
  return one_lane.Flush();
}

Status DecodeStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out) {
  TableStream s;
  CG_RETURN_IF_ERROR(ParseStreamWithTables(in, cycle, out, &s));
  TableStream* ps = &s;
  return DecodeStreamsWithTables(std::span<TableStream* const>(&ps, 1));
}

Status DecodeStream(ByteReader& in, std::span<uint32_t> out) {
  ParsedStream s;
  CG_RETURN_IF_ERROR(ParseStream(in, out.size(), &s));
  ParsedStream* ps = &s;
  uint32_t* po = out.data();
  return DecodeParsed(std::span<ParsedStream* const>(&ps, 1), std::span<uint32_t* const>(&po, 1));
}

}  // namespace cachegen::rans
