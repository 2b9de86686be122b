#include "codec/cachegen/fused_decode.h"

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/bytes.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include "codec/rans_avx2.h"
#endif

namespace cachegen::internal {

#if defined(__x86_64__)
namespace {

constexpr uint32_t kMaxStreams = 8;  // per batch: 4 heads x anchor/delta, or 8 heads of anchors

// Per-thread copies of payload ends (see Stream::Pad).
std::vector<uint8_t>& PadBuffer(uint32_t k) {
  thread_local std::vector<uint8_t> pads[kMaxStreams];
  return pads[k];
}

// What a batch keeps of one 8-lane stream outside the hot loop, whose state,
// table and read pointer live in locals. Rounds read 8 words whatever they
// consume, so a stream runs from its payload while a group's worth of rounds
// plus that lookahead fits, and from a zero-padded copy of its last words
// after that (the approach of rans.cc's DecodeLanes8Avx2).
struct Stream {
  const uint8_t* words = nullptr;  // payload body, or its padded copy
  size_t limit = 0;                // words at `words` that are payload
  bool padded = false;
  uint32_t escape = 0;
  ByteReader esc;
};

// Returns where to read from for `need` more words from w (a pointer into
// s.words): w itself, or, when fewer remain, the start of a copy of the
// remaining words followed by zeros. need >= the words left when it
// switches, so the copy never needs to grow again.
__attribute__((noinline)) const uint8_t* PadTail(Stream& s, const uint8_t* w, size_t need, uint32_t k) {
  const size_t rem = s.limit - static_cast<size_t>(w - s.words) / 2;
  std::vector<uint8_t>& buf = PadBuffer(k);
  buf.assign(2 * (rem + need), 0);
  std::memcpy(buf.data(), w, 2 * rem);
  s.words = buf.data();
  s.limit = rem;
  s.padded = true;
  return s.words;
}
inline const uint8_t* EnsureReadable(Stream& s, const uint8_t* w, size_t need, uint32_t k) {
  if (s.padded || s.limit - static_cast<size_t>(w - s.words) / 2 >= need) return w;
  return PadTail(s, w, need, k);
}

// pred + float(q) * st: a multiply, then an add (no FMA), the generic path's
// arithmetic.
__attribute__((target("avx2"), always_inline)) inline __m256 Dequant(__m256i q, __m256 pred, const float* st) {
  return _mm256_add_ps(pred, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st)));
}

template <DType kOut>
__attribute__((target("avx2,f16c"), always_inline)) inline void Store8(uint8_t* dst, __m256 v) {
  if constexpr (kOut == DType::kF16) {
    // The memory form of vcvtps2ph, which the intrinsic does not give.
    asm("vcvtps2ph $0, %1, %0" : "=m"(*reinterpret_cast<__m128i_u*>(dst)) : "x"(v));
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
}

// Table entries (form kZigZagValues) hold the value in the top byte; the
// escape symbol's is this marker.
constexpr int kEscapeMark = -128;

// The decode tables of a batch's streams, which are consecutive
// ParsedStreams: one base pointer and constant offsets, so that they take no
// registers in the hot loop.
struct Tables {
  const uint8_t* base;
  const int* operator[](int k) const {
    return reinterpret_cast<const int*>(base + size_t(k) * sizeof(rans::ParsedStream));
  }
};

// One round of stream k: its 8 values, escapes still marked.
template <int S>
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Values8(__m256i (&x)[S], const uint8_t* (&w)[S],
                                                                           Tables tbl, int k) {
  size_t used = 0;
  const __m256i e = rans::avx2::Round8<true>(x[k], tbl[k], w[k], used);
  w[k] += 2 * used;
  return _mm256_srai_epi32(e, 24);
}

// Replaces the marked escapes among the 8 values in *q by the values they
// stand for (UnZigZag(escape symbol + the stream's next escape varint)).
// False when the escape area runs out or a symbol exceeds 32 bits.
__attribute__((target("avx2"), noinline, cold)) bool PatchEscapes(__m256i* q, Stream& s) {
  alignas(32) int32_t v[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), *q);
  for (int32_t& x : v) {
    if (x != kEscapeMark) continue;
    const uint64_t d = s.esc.Varint();
    if (!s.esc.ok() || d > UINT32_MAX - s.escape) return false;
    const uint32_t u = static_cast<uint32_t>(s.escape + d);
    x = static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1);
  }
  *q = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  return true;
}

// Where one token group's rows and parameters are.
struct GroupRows {
  const float* mean;  // per channel of the batch's heads
  const float* sta;   // steps of the anchor row
  const float* std_;  // ... of the delta row
  uint8_t* ra;        // anchor row (head0, dim 0) in the sink
  uint8_t* rd;        // delta row
  int64_t head_bytes;
};

// The rows of one token group: K heads, each an anchor row (stream 2h with
// pairs, h without) and with kPair its delta row (stream 2h + 1).
//
// Unchecked (kChecked false), escapes are not resolved: the smallest value
// seen goes to *lowest, and a group where it is the escape mark is decoded
// again, checked, from its starting states. Checked, escapes are patched as
// they come; false on a bad escape.
template <int K, bool kPairs, bool kPair, bool kChecked, bool kNanCheck, DType kOut, int S>
__attribute__((target("avx2,bmi2,f16c"), always_inline)) inline bool Group(__m256i (&x)[S], const uint8_t* (&w)[S],
                                                                          Tables tbl, Stream* s,
                                                                          uint32_t D, const GroupRows& g,
                                                                          __m256i& lowest, __m256& nan) {
  constexpr size_t kEsize = kOut == DType::kF16 ? 2 : 4;
  constexpr int kA = kPairs ? 2 : 1;
  const __m256i mark = _mm256_set1_epi32(kEscapeMark);
  for (uint32_t d = 0; d < D; d += 8) {
#pragma GCC unroll 8
    for (int h = 0; h < K; ++h) {
      __m256i qa = Values8(x, w, tbl, kA * h);
      __m256i qd = qa;
      if constexpr (kPair) qd = Values8(x, w, tbl, 2 * h + 1);
      if constexpr (kChecked) {
        if (!_mm256_testz_si256(_mm256_cmpeq_epi32(qa, mark), _mm256_cmpeq_epi32(qa, mark)) &&
            !PatchEscapes(&qa, s[kA * h]))
          return false;
        if (kPair && !_mm256_testz_si256(_mm256_cmpeq_epi32(qd, mark), _mm256_cmpeq_epi32(qd, mark)) &&
            !PatchEscapes(&qd, s[2 * h + 1]))
          return false;
      } else {
        lowest = _mm256_min_epi32(lowest, kPair ? _mm256_min_epi32(qa, qd) : qa);
      }
      const size_t c = size_t(h) * D + d;
      const __m256 va = Dequant(qa, _mm256_loadu_ps(g.mean + c), g.sta + c);
      Store8<kOut>(g.ra + h * g.head_bytes + kEsize * d, va);
      if constexpr (kPair) {
        // Deltas are coded against the anchor's f32 reconstruction.
        const __m256 vd = Dequant(qd, va, g.std_ + c);
        Store8<kOut>(g.rd + h * g.head_bytes + kEsize * d, vd);
        if constexpr (kNanCheck) nan = _mm256_or_ps(nan, _mm256_cmp_ps(va, vd, _CMP_UNORD_Q));
      } else if constexpr (kNanCheck) {
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(va, va, _CMP_UNORD_Q));
      }
    }
  }
  return true;
}

// A group decoded again with escapes resolved, from the states it started
// with (x, w: updated to where it ends).
template <int K, bool kPairs, DType kOut, int S>
__attribute__((target("avx2,bmi2,f16c"), noinline, cold)) bool CheckedGroup(__m256i (&x)[S], const uint8_t* (&w)[S],
                                                                           Tables tbl, Stream* s,
                                                                           uint32_t D, const GroupRows& g, bool pair,
                                                                           __m256& nan) {
  __m256i unused = _mm256_setzero_si256();
  if (pair) return Group<K, kPairs, kPairs, true, kOut == DType::kF16, kOut>(x, w, tbl, s, D, g, unused, nan);
  return Group<K, kPairs, false, true, kOut == DType::kF16, kOut>(x, w, tbl, s, D, g, unused, nan);
}

// Whether values of this batch can overflow to Inf (and so give NaN): not
// when |mean| + 2^32 |step| stays far below the float range, as escapes are
// below 2^32.
bool MayOverflow(const FusedSection& fs, size_t c0, size_t n) {
  float top_mean = 0, top_st = 0;
  for (size_t c = c0; c < c0 + n; ++c) {
    top_mean = std::max(top_mean, std::fabs(fs.mean[c]));
    top_st = std::max({top_st, std::fabs(fs.st[c]), std::fabs(fs.st_recent[c])});
  }
  return !(double(top_mean) + 4294967296.0 * double(top_st) < 1e37);  // also true for NaN
}

template <int K, bool kPairs, DType kOut, bool kNanCheck>
__attribute__((target("avx2,bmi2,f16c"))) bool DecodeBatch(const FusedSection& fs, const rans::ParsedStream* ps,
                                                          uint32_t head0) {
  constexpr int S = kPairs ? 2 * K : K;
  const SectionLayout& l = *fs.layout;
  const SectionSink& sink = *fs.sink;
  const uint32_t D = l.head_dim, tq = l.quantized_tokens();
  // The hot state in locals whose address is never taken: the output stores
  // may alias anything else.
  static_assert(offsetof(rans::ParsedStream, table) == 0);
  const Tables tbl{reinterpret_cast<const uint8_t*>(ps)};
  __m256i x[S];
  const uint8_t* w[S];
  Stream s[S];
  for (int k = 0; k < S; ++k) {
    const rans::ParsedStream& p = ps[k];
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.state));
    s[k].words = w[k] = p.payload.data() + 4 * 8;
    s[k].limit = p.payload.size() / 2 - 2 * 8;
    s[k].escape = p.escape;
    s[k].esc = ByteReader(p.esc);
  }
  const size_t c0 = size_t{head0} * D;
  GroupRows g;
  g.mean = fs.mean + c0;
  g.head_bytes = sink.view.strides().head * int64_t{kOut == DType::kF16 ? 2 : 4};
  __m256 nan = _mm256_setzero_ps();
  const __m256i mark = _mm256_set1_epi32(kEscapeMark);
  constexpr uint32_t G = kPairs ? 2 : 1;
  for (uint32_t t = 0; t < tq; t += G) {
    const bool pair = kPairs && t + 1 < tq;
    for (int k = 0; k < S; ++k) w[k] = EnsureReadable(s[k], w[k], D + 8, k);  // a group reads <= D + 8 words
    g.ra = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t, head0, 0));
    g.sta = (t >= l.recent_begin ? fs.st_recent : fs.st) + c0;
    if (pair) {
      g.rd = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t + 1, head0, 0));
      g.std_ = (t + 1 >= l.recent_begin ? fs.st_recent : fs.st) + c0;
    }
    __m256i x0[S];
    const uint8_t* w0[S];
    for (int k = 0; k < S; ++k) x0[k] = x[k], w0[k] = w[k];
    __m256i lowest = _mm256_setzero_si256();
    if (pair) {
      Group<K, kPairs, kPairs, false, kNanCheck, kOut>(x, w, tbl, s, D, g, lowest, nan);
    } else {
      Group<K, kPairs, false, false, kNanCheck, kOut>(x, w, tbl, s, D, g, lowest, nan);
    }
    if (!_mm256_testz_si256(_mm256_cmpeq_epi32(lowest, mark), _mm256_cmpeq_epi32(lowest, mark))) [[unlikely]] {
      if (!CheckedGroup<K, kPairs, kOut>(x0, w0, tbl, s, D, g, pair, nan)) return false;
      for (int k = 0; k < S; ++k) x[k] = x0[k], w[k] = w0[k];
    }
    for (int k = 0; k < S; ++k)
      if (size_t(w[k] - s[k].words) / 2 > s[k].limit) return false;  // a padded stream read past its payload
  }
  // The checks rANS makes at a stream's end (rans.cc FinishStream).
  const __m256i low = _mm256_set1_epi32(1 << 16);
  for (int k = 0; k < S; ++k) {
    if (size_t(w[k] - s[k].words) / 2 != s[k].limit || s[k].esc.remaining() != 0) return false;
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(x[k], low)) != -1) return false;
  }
  // F16C keeps NaN payloads, F32ToF16 does not: NaNs (hostile or overflowing
  // input only) go to the generic path, which stores rows through StoreRow.
  return _mm256_testz_ps(nan, nan);
}

// Heads in power-of-two sub-batches (fewer instantiations).
template <bool kPairs, DType kOut, bool kNanCheck>
bool DecodeHeads(const FusedSection& s, const rans::ParsedStream* ps, uint32_t head0, uint32_t heads) {
  constexpr uint32_t kPer = kPairs ? 2 : 1;
  while (heads > 0) {
    bool ok;
    uint32_t n;
    if (heads >= 8 && !kPairs) {
      n = 8, ok = DecodeBatch<8, kPairs, kOut, kNanCheck>(s, ps, head0);
    } else if (heads >= 4) {
      n = 4, ok = DecodeBatch<4, kPairs, kOut, kNanCheck>(s, ps, head0);
    } else if (heads >= 2) {
      n = 2, ok = DecodeBatch<2, kPairs, kOut, kNanCheck>(s, ps, head0);
    } else {
      n = 1, ok = DecodeBatch<1, kPairs, kOut, kNanCheck>(s, ps, head0);
    }
    if (!ok) return false;
    heads -= n, head0 += n, ps += n * kPer;
  }
  return true;
}

template <bool kPairs>
bool DecodeAs(const FusedSection& s, const rans::ParsedStream* ps, uint32_t head0, uint32_t heads) {
  if (s.sink->view.dtype() == DType::kF32) return DecodeHeads<kPairs, DType::kF32, false>(s, ps, head0, heads);
  if (MayOverflow(s, size_t{head0} * s.layout->head_dim, size_t{heads} * s.layout->head_dim))
    return DecodeHeads<kPairs, DType::kF16, true>(s, ps, head0, heads);
  return DecodeHeads<kPairs, DType::kF16, false>(s, ps, head0, heads);
}

}  // namespace
#endif

bool FusedApplies(const SectionLayout& l, const SectionSink& sink, bool use_delta) {
#if defined(__x86_64__)
  const DType dt = sink.view.dtype();
  return simd::Avx2() && !l.rotate && !sink.rope && sink.view.strides().dim == 1 && l.head_dim % 8 == 0 &&
         (dt == DType::kF16 || dt == DType::kF32) && (!use_delta || l.group_tokens == 2);
#else
  (void)l, (void)sink, (void)use_delta;
  return false;
#endif
}

bool DecodeFusedBatch(const FusedSection& s, const rans::ParsedStream* streams, uint32_t head0, uint32_t heads) {
#if defined(__x86_64__)
  const uint32_t n = s.use_delta ? 2 * heads : heads;
  if (n == 0 || n > kMaxStreams) return false;
  for (uint32_t k = 0; k < n; ++k)
    if (streams[k].mode != rans::kModeRans || streams[k].lanes != 8 ||
        streams[k].form != rans::TableForm::kZigZagValues)
      return false;
  return s.use_delta ? DecodeAs<true>(s, streams, head0, heads) : DecodeAs<false>(s, streams, head0, heads);
#else
  (void)s, (void)streams, (void)head0, (void)heads;
  return false;
#endif
}

}  // namespace cachegen::internal
