// The rANS decoder. Every stream decodes as a cycle of decode tables (symbol
// i uses cycle[i % period]); a stream with its own inline table
// (ParsedStream) is a cycle of one. Streams of one shape decode in lockstep
// groups (8-lane streams in AVX2, the rest scalar), so that one stream's
// chain of dependent lookups and multiplies overlaps the others'; every
// stream ends in the same checks (FinishStream).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
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

constexpr int kMaxGroup = 8;

using Body = internal::PaddedWords;

std::vector<uint8_t>& PadCopy(int k) {
  thread_local std::vector<uint8_t> copies[kMaxGroup];
  return copies[k];
}

Status PayloadMismatch() { return Corrupt("payload length does not match the coded symbols"); }

// Adds the next varint of er to the escape symbol *v. False when er runs out
// or the value would exceed 32 bits.
bool ReadEscape(uint32_t* v, ByteReader& er) {
  const uint64_t d = er.Varint();
  if (!er.ok() || d > UINT32_MAX - *v) return false;
  *v += static_cast<uint32_t>(d);
  return true;
}

// ReadEscape for each escape symbol e in out[i0, i1), in order.
bool PatchEscapes(uint32_t e, uint32_t* out, size_t i0, size_t i1, ByteReader& er) {
  constexpr size_t kScan = 32;
  for (; i0 < i1; i0 += kScan) {
    const size_t end = std::min(i1, i0 + kScan);
    bool any = false;  // branch-free scan first: escapes are rare
    for (size_t i = i0; i < end; ++i) any |= out[i] == e;
    if (!any) continue;
    for (size_t i = i0; i < end; ++i)
      if (out[i] == e && !ReadEscape(&out[i], er)) return false;
  }
  return true;
}

#if defined(__x86_64__)
// PatchEscapes, 32 symbols per test.
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

// PatchEscapes over out[0, n).
bool PatchAllEscapes(uint32_t e, uint32_t* out, size_t n, ByteReader& er) {
#if defined(__x86_64__)
  if (simd::Avx2()) return PatchEscapesAvx2(e, out, n, er);
#endif
  return PatchEscapes(e, out, 0, n, er);
}

// Escape symbols (each table's own) replaced by their values, read in symbol
// order from the escape area, which must be used up.
Status ResolveEscapes(const TableStream& s) {
  ByteReader er(s.esc);
  bool ok = true;
  if (s.cycle.size() == 1) {
    const uint32_t e = s.cycle[0]->escape;
    ok = e == kNoEscape || PatchAllEscapes(e, s.out, s.n, er);  // kNoEscape: no symbol decodes to it
  } else {
    for (size_t i = 0, p = 0; ok && i < s.n; ++i, p = p + 1 == s.cycle.size() ? 0 : p + 1)
      if (s.out[i] == s.cycle[p]->escape) ok = ReadEscape(&s.out[i], er);
  }
  if (!ok) return Corrupt("escape area exhausted or out of range");
  if (er.remaining() != 0) return Corrupt("escape area has unread bytes");
  return Status::Ok();
}

// Symbols [done, n) of a stream one at a time with checked reads, from the
// states in s.state and b; then the checks every stream ends with: the
// payload read exactly, every lane back at its initial state, the escapes.
Status FinishStream(TableStream& s, Body& b, size_t done) {
  const size_t period = s.cycle.size();
  uint32_t* x = s.state;
  for (size_t i = done, j = done % s.lanes, p = done % period; i < s.n;
       ++i, j = j + 1 == s.lanes ? 0 : j + 1, p = p + 1 == period ? 0 : p + 1) {
    s.out[i] = Step(x[j], s.cycle[p]->entry);
    if (x[j] < kL) {
      if (b.pos >= b.limit) return PayloadMismatch();
      x[j] = (x[j] << 16) | Load16(b.words + 2 * b.pos++);
    }
  }
  if (b.pos != b.limit) return Corrupt("payload has unread words after the last symbol");
  for (uint32_t j = 0; j < s.lanes; ++j)
    if (x[j] != kL) return Corrupt("final state of lane " + std::to_string(j) + " is not the initial value");
  return ResolveEscapes(s);
}

// K streams of equal length, lanes and period, scalar: blocks of whole
// rounds (one symbol per lane), about 64 symbols, each reading at most one
// word. kLanes: the streams' lanes, 0 for any count. Leaves the last partial
// block to FinishStream.
template <int K, bool kOneTable, uint32_t kLanes>
Status ScalarGroup(TableStream* const* s, Body* b, size_t* done) {
  const size_t n = s[0]->n, period = s[0]->cycle.size();
  const uint32_t lanes = kLanes ? kLanes : s[0]->lanes;
  const size_t rounds = std::max<size_t>(1, 64 / lanes), block = rounds * lanes;
  // Everything a step needs in locals: the output stores could alias the
  // streams' states, which would otherwise be reloaded every step.
  uint32_t x[K][kLanes ? kLanes : kMaxLanes];
  const DecodeTable* const* cyc[K];
  const uint32_t* tbl[K];
  uint32_t* out[K];
  const uint8_t* w[K];
  size_t pos[K];
  for (int k = 0; k < K; ++k) {
    std::copy(s[k]->state, s[k]->state + lanes, x[k]);
    cyc[k] = s[k]->cycle.data();
    tbl[k] = cyc[k][0]->entry;
    out[k] = s[k]->out;
  }
  size_t i = 0, p = 0;
  for (; n - i >= block; i += block) {
    for (int k = 0; k < K; ++k) b[k].Ensure(block), w[k] = b[k].words, pos[k] = b[k].pos;
    for (size_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 8
      for (uint32_t j = 0; j < lanes; ++j) {
#pragma GCC unroll 4
        for (int k = 0; k < K; ++k) {
          out[k][i + r * lanes + j] = Step(x[k][j], kOneTable ? tbl[k] : cyc[k][p]->entry);
          RenormUnchecked(x[k][j], w[k], pos[k]);
        }
        if constexpr (!kOneTable) p = p + 1 == period ? 0 : p + 1;
      }
    }
    for (int k = 0; k < K; ++k) {
      b[k].pos = pos[k];
      if (b[k].Overrun()) return PayloadMismatch();
    }
  }
  for (int k = 0; k < K; ++k) std::copy(x[k], x[k] + lanes, s[k]->state);
  *done = i;
  return Status::Ok();
}

#if defined(__x86_64__)
// K 8-lane streams of equal length and period, in AVX2 rounds of 8 symbols
// (lane j of round r is symbol 8r + j): with one table each (kOneTable), or
// a period that is a multiple of 8, so that a round's tables are 8
// consecutive cycle entries. Leaves the last partial round to FinishStream.
template <int K, bool kOneTable>
__attribute__((target("avx2,bmi2"))) Status Avx2Group(TableStream* const* s, Body* b, size_t* done) {
  constexpr size_t kRounds = 8;
  const size_t n = s[0]->n, period = s[0]->cycle.size();
  // Everything a round needs in locals: the output stores could alias the
  // streams' fields, which would otherwise be reloaded every round.
  __m256i x[K];
  const DecodeTable* const* cyc[K];
  const int* tbl[K];
  uint32_t* out[K];
  const uint8_t* w[K];
  size_t pos[K];
  for (int k = 0; k < K; ++k) {
    x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s[k]->state));
    cyc[k] = s[k]->cycle.data();
    tbl[k] = reinterpret_cast<const int*>(cyc[k][0]->entry);
    out[k] = s[k]->out;
  }
  const __m256i sym_mask = _mm256_set1_epi32(0xff);
  size_t i = 0, p = 0;
  while (n - i >= 8) {
    const size_t rounds = std::min(kRounds, (n - i) / 8);
    // A round reads 8 words at pos and consumes at most 8.
    for (int k = 0; k < K; ++k) b[k].Ensure(8 * rounds + 8), w[k] = b[k].words, pos[k] = b[k].pos;
    for (size_t r = 0; r < rounds; ++r, i += 8) {
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) {
        const __m256i e = kOneTable ? avx2::Round8(x[k], tbl[k], w[k], pos[k])
                                    : avx2::Round8Tables(x[k], cyc[k] + p, w[k], pos[k]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[k] + i), _mm256_and_si256(e, sym_mask));
      }
      if constexpr (!kOneTable) p = p + 8 == period ? 0 : p + 8;
    }
    for (int k = 0; k < K; ++k) {
      b[k].pos = pos[k];
      if (b[k].Overrun()) return PayloadMismatch();
    }
  }
  for (int k = 0; k < K; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(s[k]->state), x[k]);
  *done = i;
  return Status::Ok();
}
#endif

// How a group of streams of one shape decodes: 8-lane streams in AVX2
// where their cycle allows, the rest scalar (one and 8 lanes specialised).
enum class Kernel { kScalar, kScalarOneLane, kScalarEightLanes, kAvx2 };

Kernel KernelOf(const TableStream& s) {
#if defined(__x86_64__)
  if (s.lanes == 8 && (s.cycle.size() == 1 || s.cycle.size() % 8 == 0) && simd::Avx2()) return Kernel::kAvx2;
#endif
  if (s.lanes == 1) return Kernel::kScalarOneLane;
  return s.lanes == 8 ? Kernel::kScalarEightLanes : Kernel::kScalar;
}

template <int K, bool kOneTable>
Status DecodeGroupOf(Kernel kernel, TableStream* const* s, Body* b, size_t* done) {
  switch (kernel) {
    case Kernel::kAvx2:
#if defined(__x86_64__)
      return Avx2Group<K, kOneTable>(s, b, done);
#else
      break;
#endif
    case Kernel::kScalarOneLane:
      return ScalarGroup<K, kOneTable, 1>(s, b, done);
    case Kernel::kScalarEightLanes:
      return ScalarGroup<K, kOneTable, 8>(s, b, done);
    case Kernel::kScalar:
      break;
  }
  return ScalarGroup<K, kOneTable, 0>(s, b, done);
}

template <int K>
Status DecodeGroup(Kernel kernel, TableStream* const* s, Body* b, size_t* done) {
  return s[0]->cycle.size() == 1 ? DecodeGroupOf<K, true>(kernel, s, b, done)
                                 : DecodeGroupOf<K, false>(kernel, s, b, done);
}

// Streams of one shape (kernel, length, lanes, period) waiting to be decoded
// in lockstep groups of 8, 4, 2 and 1, each finished alone. Groups of 8 only
// for AVX2 streams of one table (measured 2, 4, 8 streams: 510, 770, 850 M
// symbols/s); with a table per lane 8 streams spill registers (BM_RansDecodeTableCycle
// about 10 % slower than 4).
class PendingStreams {
 public:
  explicit PendingStreams(Kernel kernel) : kernel_(kernel) {}
  Status Add(TableStream* s) {
    if (n_ > 0 && (s->n != s_[0]->n || s->lanes != s_[0]->lanes || s->cycle.size() != s_[0]->cycle.size()))
      CG_RETURN_IF_ERROR(Flush());
    s_[n_++] = s;
    const size_t most = kernel_ == Kernel::kAvx2 && s->cycle.size() == 1 ? 8 : 4;
    return n_ == most ? Flush() : Status::Ok();
  }
  Status Flush() {
    size_t off = 0;
    CG_RETURN_IF_ERROR(Take<8>(&off));
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
    TableStream* const* s = s_ + *off;
    Body b[K];
    for (int k = 0; k < K; ++k) {
      b[k].words = s[k]->payload.data() + 4 * s[k]->lanes;
      b[k].limit = s[k]->payload.size() / 2 - 2 * s[k]->lanes;
      b[k].copy = &PadCopy(k);
    }
    size_t done = 0;
    CG_RETURN_IF_ERROR(DecodeGroup<K>(kernel_, s, b, &done));
    for (int k = 0; k < K; ++k) CG_RETURN_IF_ERROR(FinishStream(*s[k], b[k], done));
    *off += K;
    return Status::Ok();
  }

  Kernel kernel_;
  TableStream* s_[kMaxGroup];
  size_t n_ = 0;
};

}  // namespace

Status DecodeStreamsWithTables(std::span<TableStream* const> streams) {
  // Streams of one shape next to each other (a section's anchor and delta
  // streams alternate), so they can share groups. Callers pass a batch of a
  // few streams at a time: per-thread scratch and an insertion sort (stable)
  // keep allocations out of every call.
  thread_local std::vector<TableStream*> order;
  order.assign(streams.begin(), streams.end());
  const auto shape = [](const TableStream* s) { return std::tuple(s->n, s->lanes, s->cycle.size()); };
  for (size_t i = 1; i < order.size(); ++i)
    for (size_t j = i; j > 0 && shape(order[j]) < shape(order[j - 1]); --j) std::swap(order[j], order[j - 1]);
  PendingStreams pending[] = {PendingStreams(Kernel::kScalar), PendingStreams(Kernel::kScalarOneLane),
                              PendingStreams(Kernel::kScalarEightLanes), PendingStreams(Kernel::kAvx2)};
  for (TableStream* s : order) {
    if (s->mode == kModeEmpty) continue;
    if (s->mode == kModeConstant) {
      std::fill(s->out, s->out + s->n, s->constant);
      continue;
    }
    if (s->cycle.empty()) return Status::Internal("rANS stream: empty table cycle");
    CG_RETURN_IF_ERROR(pending[static_cast<int>(KernelOf(*s))].Add(s));
  }
  for (PendingStreams& p : pending) CG_RETURN_IF_ERROR(p.Flush());
  return Status::Ok();
}

Status DecodeStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out) {
  TableStream s;
  CG_RETURN_IF_ERROR(ParseStreamWithTables(in, cycle, out, &s));
  TableStream* ps = &s;
  return DecodeStreamsWithTables(std::span<TableStream* const>(&ps, 1));
}

Status DecodeParsed(std::span<ParsedStream* const> streams, std::span<uint32_t* const> outs) {
  // Each stream as the cycle of its one table (per-thread scratch: no
  // allocation per call once grown).
  thread_local std::vector<TableStream> as_cycles;
  thread_local std::vector<const DecodeTable*> tables;
  thread_local std::vector<TableStream*> views;
  const size_t n = streams.size();
  if (as_cycles.size() < n) as_cycles.resize(n), tables.resize(n), views.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const ParsedStream& p = *streams[k];
    if (p.form != TableForm::kSymbols) return Status::Internal("rANS stream: table form DecodeParsed cannot decode");
    TableStream& t = as_cycles[k];
    tables[k] = &p.table;
    t.n = p.n;
    t.mode = p.mode;
    t.constant = p.constant;
    t.lanes = p.lanes;
    std::copy(p.state, p.state + p.lanes, t.state);
    t.esc = p.esc;
    t.payload = p.payload;
    t.cycle = std::span<const DecodeTable* const>(&tables[k], 1);
    t.out = outs[k];
    views[k] = &t;
  }
  return DecodeStreamsWithTables(std::span(views.data(), n));
}

Status DecodeStream(ByteReader& in, std::span<uint32_t> out) {
  ParsedStream s;
  CG_RETURN_IF_ERROR(ParseStream(in, out.size(), &s));
  ParsedStream* ps = &s;
  uint32_t* po = out.data();
  return DecodeParsed(std::span<ParsedStream* const>(&ps, 1), std::span<uint32_t* const>(&po, 1));
}

}  // namespace cachegen::rans
