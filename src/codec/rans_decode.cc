// Decoding of inline-table rANS streams (ParsedStream): the scalar lane
// decoders, the AVX2 8-lane decoder and the lockstep groups of DecodeParsed.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "codec/rans.h"
#include "codec/rans_avx2.h"
#include "codec/rans_internal.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen::rans {

using internal::Corrupt;
using internal::kL;
using internal::Load16;
using internal::RenormUnchecked;
using internal::Step;

namespace {

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

Status DecodeStream(ByteReader& in, std::span<uint32_t> out) {
  ParsedStream s;
  CG_RETURN_IF_ERROR(ParseStream(in, out.size(), &s));
  ParsedStream* ps = &s;
  uint32_t* po = out.data();
  return DecodeParsed(std::span<ParsedStream* const>(&ps, 1), std::span<uint32_t* const>(&po, 1));
}

}  // namespace cachegen::rans
