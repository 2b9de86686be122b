// The output side of the fused section schedule (fused_decode.cc): where a
// batch's rows go and how 8 decoded values of a row are stored from
// registers -- RoPE redone, f16/bf16/f32, NaN noted -- or, with head
// transforms, gathered in the coding domain and turned back a few rows at a
// time. Every form gives the generic schedule's bytes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/cachegen/fused_decode.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/rope.h"
#include "common/convert_avx2.h"

namespace cachegen::internal::fused {

template <DType kOut>
__attribute__((target("avx2,f16c"), always_inline)) inline void Store8(uint8_t* dst, __m256 v) {
  if constexpr (kOut == DType::kF16) {
    // The memory form of vcvtps2ph, which the intrinsic does not give.
    asm("vcvtps2ph $0, %1, %0" : "=m"(*reinterpret_cast<__m128i_u*>(dst)) : "x"(v));
  } else if constexpr (kOut == DType::kBF16) {
    const __m256i b = avx2::ToBF16(v);  // each lane <= 0xffff: packus keeps it
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
}

// One output row of a token group: its token, where it goes (head0, dim 0 in
// the sink), its steps (channels of head0 on) and, for RoPE keys, its token's
// cos/sin (pair 0).
struct Row {
  uint32_t token = 0;
  uint32_t slot = 0;  // head transforms: its place among the rows waiting for FlushRows
  uint8_t* dst = nullptr;
  const float* st = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// What every row of a batch shares.
struct RowContext {
  const float* mean;     // per channel of the batch's heads
  int64_t head_bytes;
  uint32_t rope_dims;    // rotated dims per head (RoPE keys)
  float* stash;          // NeoX RoPE: first-half values [head][row kind][dims / 2]
  float* anchor;         // groups of more than 2 tokens: anchor values [head][D]
  // Codebook (FusedSection): levels, and per stream kind the level offsets
  // of the batch's channels; null levels: values are the symbols' own.
  const float* levels;
  const int32_t* level_offset[2];
  uint32_t level_top;
  // Head transforms: coded-domain rows [head][slot][D] gathered here, then
  // turned back together by FlushRows; transform_t the batch's first head's U^T.
  float* coded;
  uint32_t slots;
  const float* transform_t;
  const SectionSink* sink;
  uint32_t head0;
  uint32_t dim;  // D
};

// The gathered coded-domain rows of slots [0, n) (tokens first, first + 1,
// ...; kTransform) of every head of the batch: turned back with the head's U
// (several rows per pass, HeadRowsFromCoding) and stored through the sink,
// RoPE included, exactly as the generic path stores them.
inline void FlushRows(const RowContext& g, int heads, uint32_t first, uint32_t n) {
  thread_local std::vector<float> x;
  const uint32_t D = g.dim;
  float* out = GrowScratch(x, size_t{n} * D);
  for (int h = 0; h < heads; ++h) {
    HeadRowsFromCoding(g.transform_t + size_t(h) * D * D, g.coded + size_t(h) * g.slots * D, out, D, n, D);
    for (uint32_t i = 0; i < n; ++i) g.sink->Store(first + i, g.head0 + h, out + size_t{i} * D);
  }
}

// RoPE of kind kRope (0 none, 1 normal, 2 NeoX) on the 8 values of dims
// d..d+7 of one row: the rotation's cos and sin in the lanes' order.
struct Angles {
  __m256 cos, sin;
};
constexpr int kRopeNone = 0, kRopeNormal = 1, kRopeNeox = 2;

// The angles of dims d..d+7 of row r (d < rope dims; NeoX: d in the second
// half, whose pair index is d - dims / 2).
template <int kRope>
__attribute__((target("avx2"), always_inline)) inline Angles LoadAngles(const Row& r, uint32_t d, uint32_t dims) {
  if constexpr (kRope == kRopeNormal) {
    // Dims (2i, 2i + 1) are pair i: each pair's cos and sin twice.
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    return {_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(r.cos + d / 2)), dup),
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(r.sin + d / 2)), dup)};
  } else {
    return {_mm256_loadu_ps(r.cos + (d - dims / 2)), _mm256_loadu_ps(r.sin + (d - dims / 2))};
  }
}

template <bool kNanCheck, DType kOut>
__attribute__((target("avx2,f16c"), always_inline)) inline void Put(uint8_t* dst, __m256 v, __m256& nan) {
  Store8<kOut>(dst, v);
  if constexpr (kNanCheck) nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// Stores dims d..d+7 of head h of row r (kind: 0 anchor, 1 delta; each kind
// has its NeoX stash), RoPE redone as RopeTable::Apply does it: products
// rounded, then the difference or sum (no FMA), so the bytes are the generic
// path's.
template <int kRope, bool kNanCheck, DType kOut, bool kTransform>
__attribute__((target("avx2,f16c"), always_inline)) inline void Emit(const RowContext& g, const Row& r, int kind,
                                                                    int h, uint32_t d, __m256 v, const Angles& a,
                                                                    __m256& nan) {
  if constexpr (kTransform) {
    // Gathered in the coding domain; FlushRows stores whole rows.
    _mm256_storeu_ps(g.coded + (size_t(h) * g.slots + r.slot) * g.dim + d, v);
    return;
  }
  constexpr size_t kEsize = kOut == DType::kF32 ? 4 : 2;
  uint8_t* dst = r.dst + h * g.head_bytes;
  if constexpr (kRope == kRopeNormal) {
    if (d < g.rope_dims) {
      // Even lanes x0 * c - x1 * s, odd lanes x1 * c + x0 * s (= x0 * s + x1 * c).
      const __m256 swapped = _mm256_permute_ps(v, 0xb1);
      v = _mm256_addsub_ps(_mm256_mul_ps(v, a.cos), _mm256_mul_ps(swapped, a.sin));
    }
  } else if constexpr (kRope == kRopeNeox) {
    const uint32_t half = g.rope_dims / 2;
    if (d < g.rope_dims) {
      float* stash = g.stash + (size_t(h) * 2 + kind) * half;
      if (d < half) {
        _mm256_storeu_ps(stash + d, v);  // stored with its partner, half a row later
        return;
      }
      const __m256 x0 = _mm256_loadu_ps(stash + (d - half));
      const __m256 x1 = v;
      Put<kNanCheck, kOut>(dst + kEsize * (d - half),
                           _mm256_sub_ps(_mm256_mul_ps(x0, a.cos), _mm256_mul_ps(x1, a.sin)), nan);
      v = _mm256_add_ps(_mm256_mul_ps(x0, a.sin), _mm256_mul_ps(x1, a.cos));
    }
  }
  Put<kNanCheck, kOut>(dst + kEsize * d, v, nan);
}

// Whether dims d..d+7 of a row need angles.
template <int kRope>
inline bool NeedsAngles(uint32_t d, uint32_t dims) {
  if constexpr (kRope == kRopeNormal) return d < dims;
  if constexpr (kRope == kRopeNeox) return d >= dims / 2 && d < dims;
  return false;
}

// Where the rows of a batch's tokens are.
struct RowMaker {
  const SectionSink* sink;
  const FusedSection* fs;
  uint32_t head0;
  size_t c0;
  uint32_t first_waiting = 0;  // head transforms: the token of slot 0
  Row operator()(uint32_t t) const {
    Row r;
    r.token = t;
    r.slot = t - first_waiting;
    r.dst = static_cast<uint8_t*>(sink->view.Pointer(sink->layer, sink->kv, t, head0, 0));
    r.st = (t >= fs->layout->recent_begin ? fs->st_recent : fs->st) + c0;
    if (sink->rope) {
      const size_t at = size_t{t} * sink->rope->pairs();
      r.cos = sink->rope->cos().data() + at;
      r.sin = sink->rope->sin().data() + at;
    }
    return r;
  }
};

}  // namespace cachegen::internal::fused
#endif
