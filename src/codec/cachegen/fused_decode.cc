#include "codec/cachegen/fused_decode.h"

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
const uint8_t* EnsureReadable(Stream& s, const uint8_t* w, size_t need, uint32_t k) {
  const size_t pos = static_cast<size_t>(w - s.words) / 2;
  if (s.padded || s.limit - pos >= need) return w;
  const size_t rem = s.limit - pos;
  std::vector<uint8_t>& buf = PadBuffer(k);
  buf.assign(2 * (rem + need), 0);
  std::memcpy(buf.data(), w, 2 * rem);
  s.words = buf.data();
  s.limit = rem;
  s.padded = true;
  return s.words;
}

// pred + float(UnZigZag(sym)) * st: a multiply, then an add (no FMA), the
// generic path's arithmetic.
__attribute__((target("avx2"), always_inline)) inline __m256 Dequant(__m256i sym, __m256 pred, const float* st) {
  const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(sym, 1),
                                     _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(sym, _mm256_set1_epi32(1))));
  return _mm256_add_ps(pred, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st)));
}

// Replaces escape symbols among the 8 in v by their values (escape symbol
// plus the stream's next escape varint). False when the escape area runs out
// or a value exceeds 32 bits. Rare: out of the hot loop.
__attribute__((noinline, cold)) bool PatchEscapes(uint32_t* v, Stream& s) {
  for (int j = 0; j < 8; ++j) {
    if (v[j] != s.escape) continue;
    const uint64_t d = s.esc.Varint();
    if (!s.esc.ok() || d > UINT32_MAX - s.escape) return false;
    v[j] = static_cast<uint32_t>(s.escape + d);
  }
  return true;
}

template <DType kOut>
__attribute__((target("avx2,f16c"), always_inline)) inline void Store8(uint8_t* dst, __m256 v) {
  if constexpr (kOut == DType::kF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
}

// One round of stream k: its 8 symbols, escapes not yet resolved.
template <int S>
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Symbols8(__m256i (&x)[S], const uint8_t* (&w)[S],
                                                                            const int* const (&tbl)[S], int k) {
  size_t used = 0;
  const __m256i e = rans::avx2::Round8(x[k], tbl[k], w[k], used);
  w[k] += 2 * used;
  return _mm256_and_si256(e, _mm256_set1_epi32(0xff));
}

// The rows of one token group: K heads, each an anchor row (stream 2h with
// pairs, h without) and with kPair its delta row (stream 2h + 1). Returns
// false on a bad escape.
template <int K, bool kPairs, bool kPair, DType kOut, int S>
__attribute__((target("avx2,bmi2,f16c"), always_inline)) inline bool Group(
    __m256i (&x)[S], const uint8_t* (&w)[S], const int* const (&tbl)[S], Stream (&s)[S], uint32_t D,
    const float* mean, const float* sta, const float* std_, uint8_t* ra, uint8_t* rd, int64_t head_bytes,
    __m256& nan) {
  constexpr size_t kEsize = kOut == DType::kF16 ? 2 : 4;
  constexpr int kA = kPairs ? 2 : 1;
  for (uint32_t d = 0; d < D; d += 8) {
#pragma GCC unroll 8
    for (int h = 0; h < K; ++h) {
      __m256i sa = Symbols8(x, w, tbl, kA * h);
      __m256i hit = _mm256_cmpeq_epi32(sa, _mm256_set1_epi32(static_cast<int>(s[kA * h].escape)));
      __m256i sd = sa;
      if constexpr (kPair) {
        sd = Symbols8(x, w, tbl, 2 * h + 1);
        hit = _mm256_or_si256(hit, _mm256_cmpeq_epi32(sd, _mm256_set1_epi32(static_cast<int>(s[2 * h + 1].escape))));
      }
      if (!_mm256_testz_si256(hit, hit)) [[unlikely]] {
        alignas(32) uint32_t v[2][8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v[0]), sa);
        _mm256_store_si256(reinterpret_cast<__m256i*>(v[1]), sd);
        if (!PatchEscapes(v[0], s[kA * h])) return false;
        if (kPair && !PatchEscapes(v[1], s[2 * h + 1])) return false;
        sa = _mm256_load_si256(reinterpret_cast<const __m256i*>(v[0]));
        sd = _mm256_load_si256(reinterpret_cast<const __m256i*>(v[1]));
      }
      const size_t c = size_t(h) * D + d;
      const __m256 va = Dequant(sa, _mm256_loadu_ps(mean + c), sta + c);
      Store8<kOut>(ra + h * head_bytes + kEsize * d, va);
      if constexpr (kPair) {
        // Deltas are coded against the anchor's f32 reconstruction.
        const __m256 vd = Dequant(sd, va, std_ + c);
        Store8<kOut>(rd + h * head_bytes + kEsize * d, vd);
        if constexpr (kOut == DType::kF16) nan = _mm256_or_ps(nan, _mm256_cmp_ps(va, vd, _CMP_UNORD_Q));
      } else if constexpr (kOut == DType::kF16) {
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(va, va, _CMP_UNORD_Q));
      }
    }
  }
  return true;
}

template <int K, bool kPairs, DType kOut>
__attribute__((target("avx2,bmi2,f16c"))) bool DecodeBatch(const FusedSection& fs, rans::ParsedStream* const* ps,
                                                          uint32_t head0) {
  constexpr int S = kPairs ? 2 * K : K;
  const SectionLayout& l = *fs.layout;
  const SectionSink& sink = *fs.sink;
  const uint32_t D = l.head_dim, tq = l.quantized_tokens();
  // The hot state in locals: the output stores may alias anything.
  __m256i x[S];
  const uint8_t* w[S];
  const int* tbl[S];
  Stream s[S];
  for (int k = 0; k < S; ++k) {
    const rans::ParsedStream& p = *ps[k];
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.state));
    tbl[k] = reinterpret_cast<const int*>(p.table);
    s[k].words = w[k] = p.payload.data() + 4 * 8;
    s[k].limit = p.payload.size() / 2 - 2 * 8;
    s[k].escape = p.escape;
    s[k].esc = ByteReader(p.esc);
  }
  const int64_t head_bytes = sink.view.strides().head * int64_t{kOut == DType::kF16 ? 2 : 4};
  const size_t c0 = size_t{head0} * D;
  const float* mean = fs.mean + c0;
  __m256 nan = _mm256_setzero_ps();
  constexpr uint32_t G = kPairs ? 2 : 1;
  const auto used = [&](int k) { return static_cast<size_t>(w[k] - s[k].words) / 2; };
  for (uint32_t t = 0; t < tq; t += G) {
    const bool pair = kPairs && t + 1 < tq;
    for (int k = 0; k < S; ++k) w[k] = EnsureReadable(s[k], w[k], D + 8, k);  // a group reads <= D + 8 words
    auto* ra = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t, head0, 0));
    const float* sta = (t >= l.recent_begin ? fs.st_recent : fs.st) + c0;
    bool ok;
    if (pair) {
      auto* rd = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t + 1, head0, 0));
      const float* std_ = (t + 1 >= l.recent_begin ? fs.st_recent : fs.st) + c0;
      ok = Group<K, kPairs, kPairs, kOut>(x, w, tbl, s, D, mean, sta, std_, ra, rd, head_bytes, nan);
    } else {
      ok = Group<K, kPairs, false, kOut>(x, w, tbl, s, D, mean, sta, nullptr, ra, nullptr, head_bytes, nan);
    }
    if (!ok) return false;
    for (int k = 0; k < S; ++k)
      if (used(k) > s[k].limit) return false;  // a padded stream read past its payload
  }
  // The checks rANS makes at a stream's end (rans.cc FinishStream).
  const __m256i low = _mm256_set1_epi32(1 << 16);
  for (int k = 0; k < S; ++k) {
    if (used(k) != s[k].limit || s[k].esc.remaining() != 0) return false;
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(x[k], low)) != -1) return false;
  }
  // F16C keeps NaN payloads, F32ToF16 does not: NaNs (hostile or overflowing
  // input only) go to the generic path, which stores rows through StoreRow.
  return _mm256_testz_ps(nan, nan);
}

template <bool kPairs, DType kOut>
bool Dispatch(const FusedSection& s, rans::ParsedStream* const* ps, uint32_t head0, uint32_t heads) {
  switch (heads) {
    case 1: return DecodeBatch<1, kPairs, kOut>(s, ps, head0);
    case 2: return DecodeBatch<2, kPairs, kOut>(s, ps, head0);
    case 3: return DecodeBatch<3, kPairs, kOut>(s, ps, head0);
    case 4: return DecodeBatch<4, kPairs, kOut>(s, ps, head0);
  }
  if constexpr (!kPairs) {
    switch (heads) {
      case 5: return DecodeBatch<5, kPairs, kOut>(s, ps, head0);
      case 6: return DecodeBatch<6, kPairs, kOut>(s, ps, head0);
      case 7: return DecodeBatch<7, kPairs, kOut>(s, ps, head0);
      case 8: return DecodeBatch<8, kPairs, kOut>(s, ps, head0);
    }
  }
  return false;
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

bool DecodeFusedBatch(const FusedSection& s, rans::ParsedStream* const* streams, uint32_t head0, uint32_t heads) {
#if defined(__x86_64__)
  const uint32_t n = s.use_delta ? 2 * heads : heads;
  if (n == 0 || n > kMaxStreams) return false;
  for (uint32_t k = 0; k < n; ++k)
    if (streams[k]->mode != rans::kModeRans || streams[k]->lanes != 8) return false;
  const bool f16 = s.sink->view.dtype() == DType::kF16;
  if (s.use_delta)
    return f16 ? Dispatch<true, DType::kF16>(s, streams, head0, heads)
               : Dispatch<true, DType::kF32>(s, streams, head0, heads);
  return f16 ? Dispatch<false, DType::kF16>(s, streams, head0, heads)
             : Dispatch<false, DType::kF32>(s, streams, head0, heads);
#else
  (void)s, (void)streams, (void)head0, (void)heads;
  return false;
#endif
}

}  // namespace cachegen::internal
