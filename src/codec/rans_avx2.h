// The AVX2 round of the 8-lane rANS decoder (rans_decode.cc), shared with decoders
// that consume each round's symbols at once instead of storing them (the
// cachegen section decoder dequantizes them in registers).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "codec/rans.h"

namespace cachegen::rans::avx2 {

// kWordShuffle.idx[m]: for a renormalisation mask m over 8 lanes, lane j takes
// word popcount(m & ((1 << j) - 1)) of the next 8 (the scalar decoder's lanes
// read in lane order, each at most one word).
struct WordShuffle {
  alignas(32) uint32_t idx[256][8];
};
constexpr WordShuffle MakeWordShuffle() {
  WordShuffle t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t k = 0;
    for (uint32_t j = 0; j < 8; ++j) {
      t.idx[m][j] = (m >> j) & 1 ? k : 0;
      k += (m >> j) & 1;
    }
  }
  return t;
}
inline constexpr WordShuffle kWordShuffle = MakeWordShuffle();

// The rest of a round once its table entries e are looked up: the state
// update, then renormalisation from the 16-bit words at wp + 2 * pos,
// advancing pos past the words used. Always reads the 8 words at pos,
// whatever it uses.
template <bool kValues = false>
__attribute__((target("avx2,bmi2"), always_inline)) inline void Advance8(__m256i& x, __m256i e, const uint8_t* wp,
                                                                          size_t& pos) {
  const __m256i f12 = _mm256_set1_epi32(0xfff);
  const __m256i freq = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, kValues ? 12 : 8), f12),
                                        _mm256_set1_epi32(1));
  const __m256i offset = kValues ? _mm256_and_si256(e, f12) : _mm256_srli_epi32(e, 20);
  x = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x, kProbBits)), offset);
  const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + 2 * pos)));
  const __m256i wl =
      _mm256_permutevar8x32_epi32(w, _mm256_load_si256(reinterpret_cast<const __m256i*>(kWordShuffle.idx[m])));
  x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), wl), need);
  pos += static_cast<size_t>(__builtin_popcount(m));
}

// One round: decodes one symbol per lane of the states x (lane j of round r
// is symbol 8r + j of the stream) and returns their table entries
// (ParsedStream::table of form kSymbols, or with kValues of form
// kZigZagValues), then renormalises (Advance8). Lane j looks its slot up at
// tbl + offset[j] (offsets select per-lane tables of one block: a cycle of
// tables, as for a profile's channel classes; zero for one table).
template <bool kValues = false>
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Round8At(__m256i& x, const int* tbl,
                                                                             __m256i offset, const uint8_t* wp,
                                                                             size_t& pos) {
  // Table lookups through a store and eight scalar loads: on the machines
  // measured (AMD EPYC) this beat vpgatherdd (850 vs 700 M symbols/s in
  // BM_RansDecodeStreams).
  alignas(32) uint32_t sl[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sl),
                     _mm256_add_epi32(_mm256_and_si256(x, _mm256_set1_epi32(kProbScale - 1)), offset));
  const __m256i e = _mm256_setr_epi32(tbl[sl[0]], tbl[sl[1]], tbl[sl[2]], tbl[sl[3]], tbl[sl[4]], tbl[sl[5]],
                                      tbl[sl[6]], tbl[sl[7]]);
  Advance8<kValues>(x, e, wp, pos);
  return e;
}
template <bool kValues = false>
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Round8(__m256i& x, const int* tbl,
                                                                           const uint8_t* wp, size_t& pos) {
  return Round8At<kValues>(x, tbl, _mm256_setzero_si256(), wp, pos);
}

// Round8 with a table of form kSymbols per lane (tables[j] for lane j).
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Round8Tables(__m256i& x,
                                                                                 const DecodeTable* const* tables,
                                                                                 const uint8_t* wp, size_t& pos) {
  alignas(32) uint32_t sl[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sl), _mm256_and_si256(x, _mm256_set1_epi32(kProbScale - 1)));
  const __m256i e = _mm256_setr_epi32(
      static_cast<int>(tables[0]->entry[sl[0]]), static_cast<int>(tables[1]->entry[sl[1]]),
      static_cast<int>(tables[2]->entry[sl[2]]), static_cast<int>(tables[3]->entry[sl[3]]),
      static_cast<int>(tables[4]->entry[sl[4]]), static_cast<int>(tables[5]->entry[sl[5]]),
      static_cast<int>(tables[6]->entry[sl[6]]), static_cast<int>(tables[7]->entry[sl[7]]));
  Advance8<false>(x, e, wp, pos);
  return e;
}

}  // namespace cachegen::rans::avx2
#endif
