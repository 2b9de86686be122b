// Decoding of table-form rANS streams whose symbols cycle through a
// profile's decode tables (TableStream): scalar and AVX2 lockstep groups.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace cachegen::rans
