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
#include "codec/cachegen/fused_rows.h"
#include "codec/rans_internal.h"
#endif

namespace cachegen::internal {

#if defined(__x86_64__)
namespace {

using namespace fused;  // the rows side (fused_rows.h)

constexpr uint32_t kMaxStreams = 8;  // per batch: 4 heads x anchor/delta, or 8 heads of anchors

// Per-thread copies of payload ends (Stream::body).
std::vector<uint8_t>& PadBuffer(uint32_t k) {
  thread_local std::vector<uint8_t> pads[kMaxStreams];
  return pads[k];
}

// What a batch keeps of one 8-lane stream outside the hot loop, whose state,
// table and read pointer live in locals. Rounds read 8 words whatever they
// consume, so a stream's words are read as the rANS decoder's groups read
// them (rans::internal::PaddedWords: the payload, then a padded copy of its
// last words), a group's worth of rounds plus that lookahead at a time.
struct Stream {
  rans::internal::PaddedWords body;
  uint32_t escape = 0;
  const uint32_t* dim_escape = nullptr;  // per dim (table cycles), else null
  ByteReader esc;
  // Where w (a pointer into body.words) is, as body's position.
  void SetPos(const uint8_t* w) { body.pos = static_cast<size_t>(w - body.words) / 2; }
  const uint8_t* Words() const { return body.words + 2 * body.pos; }
};

// pred + v * st: a multiply, then an add (no FMA), the generic path's
// arithmetic.
__attribute__((target("avx2"), always_inline)) inline __m256 Dequant(__m256 v, __m256 pred, const float* st) {
  return _mm256_add_ps(pred, _mm256_mul_ps(v, _mm256_loadu_ps(st)));
}

// Table entries (form kZigZagValues) hold the value in the top byte; the
// escape symbol's is this marker.
constexpr int kEscapeMark = -128;

// Where a batch's streams look their slots up (FusedStream): per stream its
// table and, for a table cycle, per-dim entry offsets. A plain batch (every
// stream with its inline table: consecutive ParsedStreams) finds stream k's
// table at a constant offset from the first, which takes no register in the
// hot loop.
template <int S>
struct Lookup {
  const int* table[S];
  const int32_t* offset[S];
  const uint8_t* plain_base;  // the first stream's ParsedStream::table
};

// One round of stream k at dims d..d+7: its 8 values, escapes still marked.
template <bool kPlain, int S>
__attribute__((target("avx2,bmi2"), always_inline)) inline __m256i Values8(__m256i (&x)[S], const uint8_t* (&w)[S],
                                                                           const Lookup<S>& lk, int k, uint32_t d) {
  size_t used = 0;
  __m256i e;
  if constexpr (kPlain) {
    e = rans::avx2::Round8<true>(
        x[k], reinterpret_cast<const int*>(lk.plain_base + size_t(k) * sizeof(rans::ParsedStream)), w[k], used);
  } else {
    const __m256i off = lk.offset[k] ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lk.offset[k] + d))
                                     : _mm256_setzero_si256();
    e = rans::avx2::Round8At<true>(x[k], lk.table[k], off, w[k], used);
  }
  w[k] += 2 * used;
  return _mm256_srai_epi32(e, 24);
}

// Replaces the marked escapes among the 8 values in *q by the values they
// stand for (UnZigZag(escape symbol + the stream's next escape varint)),
// the values being those of dims d..d+7. False when the escape area runs out
// or a symbol exceeds 32 bits.
__attribute__((target("avx2"), noinline, cold)) bool PatchEscapes(__m256i* q, Stream& s, uint32_t d) {
  alignas(32) int32_t v[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), *q);
  for (int j = 0; j < 8; ++j) {
    int32_t& x = v[j];
    if (x != kEscapeMark) continue;
    const uint32_t escape = s.dim_escape ? s.dim_escape[d + j] : s.escape;
    const uint64_t more = s.esc.Varint();
    if (!s.esc.ok() || more > UINT32_MAX - escape) return false;
    const uint32_t u = static_cast<uint32_t>(escape + more);
    x = static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1);
  }
  *q = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  return true;
}

// The reconstruction level (in steps) of the 8 values q of batch channels
// c..c+7 in a stream of `kind`: the codebook's level of symbol u =
// ZigZag(q) when u <= level_top, else q itself (DequantLevels' rule).
template <bool kPlain>
__attribute__((target("avx2"), always_inline)) inline __m256 LevelOf(const RowContext& g, __m256i q, int kind,
                                                                     size_t c) {
  const __m256 plain = _mm256_cvtepi32_ps(q);
  if (kPlain || !g.levels) return plain;
  const __m256i u = _mm256_xor_si256(_mm256_slli_epi32(q, 1), _mm256_srai_epi32(q, 31));
  const __m256i top = _mm256_min_epu32(u, _mm256_set1_epi32(static_cast<int>(g.level_top)));
  const __m256i in_book = _mm256_cmpeq_epi32(top, u);
  const __m256i idx = _mm256_add_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.level_offset[kind] + c)), top);
  const __m256 y = _mm256_i32gather_ps(g.levels, idx, 4);
  return _mm256_blendv_ps(plain, y, _mm256_castsi256_ps(in_book));
}

// True when the 8 values (of dims d..d+7) hold an escape mark that
// PatchEscapes cannot resolve.
__attribute__((target("avx2"), always_inline)) inline bool BadEscape(__m256i* q, Stream& s, uint32_t d) {
  const __m256i m = _mm256_cmpeq_epi32(*q, _mm256_set1_epi32(kEscapeMark));
  return !_mm256_testz_si256(m, m) && !PatchEscapes(q, s, d);
}

// What a group's kernels are instantiated for.
// kPlain: every stream has its inline table and there is no codebook (a
// profile-free frame's sections): the lookups and levels of the general form
// are compiled out.
template <int K, bool kPairs, DType kOut, bool kNanCheck, int kRope, bool kTransform, bool kPlain>
struct BatchKind {
  static constexpr bool kPlainTables = kPlain;
  static constexpr int kHeads = K;
  static constexpr bool kHasPairs = kPairs;
  static constexpr DType kDtype = kOut;
  static constexpr bool kCheckNan = kNanCheck;
  static constexpr int kRopeKind = kRope;
  static constexpr bool kTransformed = kTransform;
  static constexpr int kStreams = kPairs ? 2 * K : K;
};

// A batch's decoding state: lane states and read pointers (locals of
// DecodeBatch whose address is never taken otherwise, so that the output
// stores cannot alias them), the streams' lookups and side data.
template <class P>
struct BatchState {
  static constexpr int S = P::kStreams;
  __m256i (&x)[S];
  const uint8_t* (&w)[S];
  const Lookup<S>& lk;
  Stream* s;
  uint32_t D;
  const RowContext& g;
};

// The first two rows of one token group: K heads, each an anchor row (stream
// 2h with deltas, h without) and with kPair its first delta row (stream 2h + 1).
//
// Unchecked (kChecked false), escapes are not resolved: the smallest value
// seen goes to *lowest, and a group where it is the escape mark is decoded
// again, checked, from its starting states. Checked, escapes are patched as
// they come; false on a bad escape.
template <class P, bool kPair, bool kChecked>
__attribute__((target("avx2,bmi2,f16c"), always_inline)) inline bool Group(BatchState<P>& b, const Row& ra,
                                                                          const Row& rd, __m256i& lowest,
                                                                          __m256& nan) {
  constexpr int K = P::kHeads, kA = P::kHasPairs ? 2 : 1, kRope = P::kRopeKind;
  constexpr DType kOut = P::kDtype;
  const RowContext& g = b.g;
  for (uint32_t d = 0; d < b.D; d += 8) {
    Angles aa{}, ad{};
    if (NeedsAngles<kRope>(d, g.rope_dims)) {
      aa = LoadAngles<kRope>(ra, d, g.rope_dims);
      if constexpr (kPair) ad = LoadAngles<kRope>(rd, d, g.rope_dims);
    }
#pragma GCC unroll 8
    for (int h = 0; h < K; ++h) {
      __m256i qa = Values8<P::kPlainTables>(b.x, b.w, b.lk, kA * h, d);
      __m256i qd = qa;
      if constexpr (kPair) qd = Values8<P::kPlainTables>(b.x, b.w, b.lk, 2 * h + 1, d);
      if constexpr (kChecked) {
        if (BadEscape(&qa, b.s[kA * h], d)) return false;
        if (kPair && BadEscape(&qd, b.s[2 * h + 1], d)) return false;
      } else {
        lowest = _mm256_min_epi32(lowest, kPair ? _mm256_min_epi32(qa, qd) : qa);
      }
      const size_t c = size_t(h) * b.D + d;
      const __m256 va = Dequant(LevelOf<P::kPlainTables>(g, qa, 0, c), _mm256_loadu_ps(g.mean + c), ra.st + c);
      // Groups of more than 2 tokens predict their later rows from it too.
      if constexpr (P::kHasPairs) _mm256_storeu_ps(g.anchor + c, va);
      Emit<kRope, P::kCheckNan, kOut, P::kTransformed>(g, ra, 0, h, d, va, aa, nan);
      if constexpr (kPair) {
        // Deltas are coded against the anchor's f32 reconstruction (before RoPE).
        Emit<kRope, P::kCheckNan, kOut, P::kTransformed>(g, rd, 1, h, d, Dequant(LevelOf<P::kPlainTables>(g, qd, 1, c), va, rd.st + c),
                                                        ad, nan);
      }
    }
  }
  return true;
}

// A further delta row of a group of more than 2 tokens (delta streams 2h + 1
// only, predicted from the anchor values kept by Group).
template <class P, bool kChecked>
__attribute__((target("avx2,bmi2,f16c"), always_inline)) inline bool DeltaRow(BatchState<P>& b, const Row& r,
                                                                             __m256i& lowest, __m256& nan) {
  constexpr int K = P::kHeads, kRope = P::kRopeKind;
  const RowContext& g = b.g;
  for (uint32_t d = 0; d < b.D; d += 8) {
    Angles a{};
    if (NeedsAngles<kRope>(d, g.rope_dims)) a = LoadAngles<kRope>(r, d, g.rope_dims);
#pragma GCC unroll 8
    for (int h = 0; h < K; ++h) {
      __m256i q = Values8<P::kPlainTables>(b.x, b.w, b.lk, 2 * h + 1, d);
      if constexpr (kChecked) {
        if (BadEscape(&q, b.s[2 * h + 1], d)) return false;
      } else {
        lowest = _mm256_min_epi32(lowest, q);
      }
      const size_t c = size_t(h) * b.D + d;
      Emit<kRope, P::kCheckNan, P::kDtype, P::kTransformed>(
          g, r, 1, h, d, Dequant(LevelOf<P::kPlainTables>(g, q, 1, c), _mm256_loadu_ps(g.anchor + c), r.st + c), a, nan);
    }
  }
  return true;
}

// One token group of n tokens starting at t (n >= 2 only with pairs).
template <class P, bool kChecked>
__attribute__((target("avx2,bmi2,f16c"), always_inline)) inline bool TokenGroup(BatchState<P>& b,
                                                                               const RowMaker& rows, uint32_t t,
                                                                               uint32_t n, __m256i& lowest,
                                                                               __m256& nan) {
  const Row ra = rows(t);
  if (!P::kHasPairs || n < 2) return Group<P, false, kChecked>(b, ra, ra, lowest, nan);
  if (!Group<P, P::kHasPairs, kChecked>(b, ra, rows(t + 1), lowest, nan)) return false;
  for (uint32_t j = 2; j < n; ++j)
    if (!DeltaRow<P, kChecked>(b, rows(t + j), lowest, nan)) return false;
  return true;
}

// A group decoded again with escapes resolved, from the states it started
// with (b's states and pointers: updated to where it ends).
template <class P>
__attribute__((target("avx2,bmi2,f16c"), noinline, cold)) bool CheckedGroup(BatchState<P>& b, const RowMaker& rows,
                                                                           uint32_t t, uint32_t n, __m256& nan) {
  __m256i unused = _mm256_setzero_si256();
  return TokenGroup<P, true>(b, rows, t, n, unused, nan);
}

// Whether values of this batch can overflow to Inf (and so give NaN): not
// when |mean| + 2^32 |step| |level| stays far below the float range, as
// escapes are below 2^32 and codebook levels within one step of their symbol
// (RoPE at most doubles a value).
bool MayOverflow(const FusedSection& fs, size_t c0, size_t n) {
  float top_mean = 0, top_st = 0;
  for (size_t c = c0; c < c0 + n; ++c) {
    top_mean = std::max(top_mean, std::fabs(fs.mean[c]));
    top_st = std::max({top_st, std::fabs(fs.st[c]), std::fabs(fs.st_recent[c])});
  }
  return !(double(top_mean) + 2 * 4294967296.0 * double(top_st) < 1e37);  // also true for NaN
}

template <class P>
__attribute__((target("avx2,bmi2,f16c"))) bool DecodeBatch(const FusedSection& fs, const FusedStream* ps,
                                                          uint32_t head0) {
  constexpr int S = P::kStreams, K = P::kHeads;
  const SectionLayout& l = *fs.layout;
  const SectionSink& sink = *fs.sink;
  const uint32_t D = l.head_dim, tq = l.quantized_tokens();
  __m256i x[S];
  const uint8_t* w[S];
  Stream s[S];
  Lookup<S> lk;
  for (int k = 0; k < S; ++k) {
    const FusedStream& p = ps[k];
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.state));
    s[k].body.words = w[k] = p.payload.data() + 4 * 8;
    s[k].body.limit = p.payload.size() / 2 - 2 * 8;
    s[k].body.copy = &PadBuffer(k);
    s[k].escape = p.escape;
    s[k].dim_escape = p.dim_escape;
    s[k].esc = ByteReader(p.esc);
    lk.table[k] = reinterpret_cast<const int*>(p.table);
    lk.offset[k] = p.dim_offset;
  }
  lk.plain_base = reinterpret_cast<const uint8_t*>(ps[0].table);
  const size_t c0 = size_t{head0} * D;
  const uint32_t C = l.channels();
  // Per-thread room for the NeoX stash, the anchor values and coded rows.
  thread_local std::vector<float> stash, anchor, coded;
  RowContext g;
  g.mean = fs.mean + c0;
  g.head_bytes = sink.view.strides().head * int64_t{P::kDtype == DType::kF32 ? 4 : 2};
  g.rope_dims = sink.rope ? sink.rope->rope().dims : 0;
  g.stash = P::kRopeKind == kRopeNeox ? GrowScratch(stash, size_t{K} * 2 * (g.rope_dims / 2)) : nullptr;
  g.anchor = P::kHasPairs ? GrowScratch(anchor, size_t{K} * D) : nullptr;
  g.levels = fs.levels;
  for (int kind = 0; kind < 2; ++kind)
    g.level_offset[kind] = fs.levels ? fs.level_offset + size_t(kind) * C + c0 : nullptr;
  g.level_top = fs.level_top;
  // Rows wait for FlushRows until at least kFlushRows have gathered (a token
  // group adds up to G).
  constexpr uint32_t kFlushRows = 4;
  g.slots = kFlushRows - 1 + std::max<uint32_t>(l.group_tokens, 1);
  g.coded = P::kTransformed ? GrowScratch(coded, size_t{K} * g.slots * D) : nullptr;
  g.transform_t = P::kTransformed ? l.transform_t + size_t{head0} * D * D : nullptr;
  g.sink = &sink;
  g.head0 = head0;
  g.dim = D;
  BatchState<P> b{x, w, lk, s, D, g};
  RowMaker rows{&sink, &fs, head0, c0};
  __m256 nan = _mm256_setzero_ps();
  const __m256i mark = _mm256_set1_epi32(kEscapeMark);
  const uint32_t G = P::kHasPairs ? l.group_tokens : 1;
  // Words a stream reads in one group at most: (G - 1) rows of deltas and
  // the lookahead of a round.
  const size_t group_words = size_t{G > 1 ? G - 1 : 1} * D + 8;
  for (uint32_t t = 0; t < tq; t += G) {
    const uint32_t n = std::min(G, tq - t);
    for (int k = 0; k < S; ++k) {
      s[k].SetPos(w[k]);
      s[k].body.Ensure(group_words);
      w[k] = s[k].Words();
    }
    __m256i x0[S];
    const uint8_t* w0[S];
    for (int k = 0; k < S; ++k) x0[k] = x[k], w0[k] = w[k];
    __m256i lowest = _mm256_setzero_si256();
    TokenGroup<P, false>(b, rows, t, n, lowest, nan);
    if (!_mm256_testz_si256(_mm256_cmpeq_epi32(lowest, mark), _mm256_cmpeq_epi32(lowest, mark))) [[unlikely]] {
      BatchState<P> redo{x0, w0, lk, s, D, g};
      if (!CheckedGroup<P>(redo, rows, t, n, nan)) return false;
      for (int k = 0; k < S; ++k) x[k] = x0[k], w[k] = w0[k];
    }
    for (int k = 0; k < S; ++k) {
      s[k].SetPos(w[k]);
      if (s[k].body.Overrun()) return false;  // a padded stream read past its payload
    }
    if constexpr (P::kTransformed) {
      const uint32_t waiting = t + n - rows.first_waiting;
      if (waiting >= kFlushRows || t + n >= tq) {
        FlushRows(g, K, rows.first_waiting, waiting);
        rows.first_waiting = t + n;
      }
    }
  }
  // The checks rANS makes at a stream's end (rans_decode.cc FinishStream).
  const __m256i low = _mm256_set1_epi32(1 << 16);
  for (int k = 0; k < S; ++k) {
    if (s[k].body.pos != s[k].body.limit || s[k].esc.remaining() != 0) return false;
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(x[k], low)) != -1) return false;
  }
  // F16C keeps NaN payloads, F32ToF16 does not: NaNs (hostile or overflowing
  // input only) go to the generic path, which stores rows through StoreRow.
  return _mm256_testz_ps(nan, nan);
}

// Heads in power-of-two sub-batches (fewer instantiations).
template <bool kPairs, DType kOut, bool kNanCheck, int kRope, bool kTransform, bool kPlain>
bool DecodeHeads(const FusedSection& s, const FusedStream* ps, uint32_t head0, uint32_t heads) {
  constexpr uint32_t kPer = kPairs ? 2 : 1;
  while (heads > 0) {
    bool ok;
    uint32_t n;
    if (heads >= 8 && !kPairs) {
      n = 8, ok = DecodeBatch<BatchKind<8, kPairs, kOut, kNanCheck, kRope, kTransform, kPlain>>(s, ps, head0);
    } else if (heads >= 4) {
      n = 4, ok = DecodeBatch<BatchKind<4, kPairs, kOut, kNanCheck, kRope, kTransform, kPlain>>(s, ps, head0);
    } else if (heads >= 2) {
      n = 2, ok = DecodeBatch<BatchKind<2, kPairs, kOut, kNanCheck, kRope, kTransform, kPlain>>(s, ps, head0);
    } else {
      n = 1, ok = DecodeBatch<BatchKind<1, kPairs, kOut, kNanCheck, kRope, kTransform, kPlain>>(s, ps, head0);
    }
    if (!ok) return false;
    heads -= n, head0 += n, ps += n * kPer;
  }
  return true;
}

template <bool kPairs, int kRope, bool kPlain>
bool DecodeWithRope(const FusedSection& s, const FusedStream* ps, uint32_t head0, uint32_t heads) {
  switch (s.sink->view.dtype()) {
    case DType::kF32:
      return DecodeHeads<kPairs, DType::kF32, false, kRope, false, kPlain>(s, ps, head0, heads);
    case DType::kBF16:  // F32ToBF16's NaN rule is done in registers too
      return DecodeHeads<kPairs, DType::kBF16, false, kRope, false, kPlain>(s, ps, head0, heads);
    case DType::kF16:
      break;
  }
  if (MayOverflow(s, size_t{head0} * s.layout->head_dim, size_t{heads} * s.layout->head_dim))
    return DecodeHeads<kPairs, DType::kF16, true, kRope, false, kPlain>(s, ps, head0, heads);
  return DecodeHeads<kPairs, DType::kF16, false, kRope, false, kPlain>(s, ps, head0, heads);
}

template <bool kPairs>
bool DecodeAs(const FusedSection& s, const FusedStream* ps, uint32_t head0, uint32_t heads, bool plain) {
  // With head transforms whole rows are stored through the sink (any dtype,
  // RoPE and strides), as the generic path stores them.
  if (s.layout->transform)
    return DecodeHeads<kPairs, DType::kF32, false, kRopeNone, true, false>(s, ps, head0, heads);
  if (!plain) {
    // Profile tables or a codebook without a transform: V sections (never
    // RoPE'd); keys of a profile without key transforms go generic.
    if (s.sink->rope) return false;
    return DecodeWithRope<kPairs, kRopeNone, false>(s, ps, head0, heads);
  }
  if (!s.sink->rope) return DecodeWithRope<kPairs, kRopeNone, true>(s, ps, head0, heads);
  if (s.sink->rope->rope().kind == RopeConfig::Kind::kNormal)
    return DecodeWithRope<kPairs, kRopeNormal, true>(s, ps, head0, heads);
  return DecodeWithRope<kPairs, kRopeNeox, true>(s, ps, head0, heads);
}

}  // namespace
#endif

bool FusedAvailable() {
#if defined(__x86_64__)
  return simd::Avx2();
#else
  return false;
#endif
}

namespace {
thread_local uint64_t fused_batches = 0;
}  // namespace

uint64_t FusedBatchesOnThisThread() { return fused_batches; }

bool DecodeFusedBatch(const FusedSection& s, const FusedStream* streams, uint32_t head0, uint32_t heads,
                      bool inline_tables) {
#if defined(__x86_64__)
  const uint32_t n = s.use_delta ? 2 * heads : heads;
  if (n == 0 || n > kMaxStreams) return false;
  const bool plain = inline_tables && !s.levels;
  const bool ok = s.use_delta ? DecodeAs<true>(s, streams, head0, heads, plain)
                              : DecodeAs<false>(s, streams, head0, heads, plain);
  fused_batches += ok;
  return ok;
#else
  (void)s, (void)streams, (void)head0, (void)heads, (void)inline_tables;
  return false;
#endif
}

}  // namespace cachegen::internal
