// The per-stream work of the CUDA decoder for the `cachegen` codec, written
// once for the device and the host (CG_HD): the host plan (gpu_plan.h) runs
// exactly this code on the CPU, and the tests compare that run byte for byte
// with the CPU decoder, so the device computes what was tested here.
//
// One job = one (frame, layer, K|V, head): the head's anchor and delta rANS
// streams, its channel statistics, its rows of the exact f16 tail; with a
// model profile also its tables (a cycle of the profile's decode tables, one
// per dim), its codebook levels and its head transform, which the plan
// resolves and hands over in flat arrays (Inputs::values, indices, tables).
// A job is
// run by a group of threads (a warp on the device, one thread on the host):
// the rANS lanes of a stream map to threads (lane j -> thread j), rows of
// head_dim values are reconstructed with the threads spread over dims.
//
// Float operations are those of the CPU decoder, in the same order
// (section_decoder.cc, hadamard.cc, rope.cc, head_transform.cc): a multiply
// then an add for each dequantized value, no contraction (nvcc -fmad=false),
// and the head transform's explicit chain of fused multiply-adds, so results
// are bit-identical. Everything here trusts a validated plan for the layout
// (offsets, sizes, destination), and still checks every payload-dependent read
// against its bounds: corrupt symbol data is reported as an error code, never
// read past.
#pragma once

#include <cmath>
#include <cstdint>

#include "codec/cachegen/section_format.h"
#include "common/half.h"
#include "common/hd.h"

namespace cachegen::gpu {

// Threads per job group on the device (one warp).
constexpr uint32_t kGroupThreads = 32;
constexpr uint32_t kRansL = 1u << 16;
constexpr uint32_t kRansSlots = 4096;
constexpr uint32_t kRansAlphabet = 256;

// Stream modes (FORMAT.md "Symbol streams").
constexpr uint8_t kStreamEmpty = 0;
constexpr uint8_t kStreamConstant = 1;
constexpr uint8_t kStreamRans = 2;   // inline table (built in the workspace)
constexpr uint8_t kStreamTable = 3;  // a cycle of a profile's tables (Inputs::tables)
CG_HD inline bool Coded(uint8_t mode) { return mode == kStreamRans || mode == kStreamTable; }

// A profile decode table in Inputs::tables: kRansSlots entries (rans.h
// DecodeTable: symbol | (freq - 1) << 8 | (slot - cum) << 20), then its
// escape symbol.
constexpr uint32_t kTableWords = kRansSlots + 1;
// An absent offset into Inputs::values.
constexpr uint32_t kNoOffset = 0xffffffffu;

// Why a job failed; 0 is success; bits 8+ name the stream (0 anchor, 1
// delta). Messages: JobStatus (gpu_plan.cc).
enum JobError : uint32_t {
  kJobOk = 0,
  kJobBadMean = 1,          // channel mean varint unreadable (plan inconsistent with bytes)
  kJobPayloadShort = 2,     // a lane needed a word after the last one
  kJobPayloadLeft = 3,      // words left after the last symbol
  kJobFinalState = 4,       // a lane's final state is not L
  kJobEscapeBad = 5,        // escape area exhausted, malformed or value over 32 bits
  kJobEscapeLeft = 6,       // escape bytes left unread
};

// One symbol stream of n symbols, validated by the plan (rans::ParseStreamHeader).
struct StreamDesc {
  uint64_t n = 0;
  uint64_t payload_off = 0;  // input offset of the payload: lane states, then body words
  uint64_t esc_off = 0;      // input offset of the escape area
  uint32_t payload_words = 0;
  uint32_t esc_len = 0;
  uint32_t table_off = 0;    // index of freq[0] in the plan's frequency array (kStreamRans)
  uint32_t cycle_off = 0;    // kStreamTable: index in Inputs::indices of `period` table numbers
  uint32_t period = 0;       // symbol i takes table indices[cycle_off + i % period]
  uint32_t constant = 0;     // constant mode's value
  uint16_t escape = 0;       // escape symbol E (kStreamRans; a cycle's tables carry their own)
  uint8_t mode = kStreamEmpty;
  uint8_t lanes = 0;
  uint8_t escape_used = 0;
};

struct JobDesc {
  StreamDesc anchor, delta;
  uint64_t sigma_off = 0;  // input offset of this head's head_dim scale codes
  uint64_t mean_off = 0;   // input offset of this head's first mean varint
  uint64_t mean_end = 0;   // end of the mean varints' bytes
  uint64_t tail_off = 0;   // input offset of the section's exact tail (f16 rows of `channels`)
  // With a model profile (kNoOffset / 0 without): this head's channel scales
  // then means (2 * head_dim floats in Inputs::values) instead of the
  // payload's codes; U^T of its head transform (head_dim^2 floats); codebook
  // levels: symbols u <= level_top reconstruct at values[indices[level_off[kind]
  // + d] + u] steps.
  uint32_t stats_off = kNoOffset;
  uint32_t transform_off = kNoOffset;
  uint32_t level_top = 0;
  uint32_t level_off[2] = {0, 0};
  float step = 0;          // section step s
  float step_recent = 0;   // s * r, used from recent_begin on
  float hadamard_scale = 0;
  uint32_t tokens = 0, quantized = 0, recent_begin = 0;
  uint32_t group = 1;      // tokens per prediction group (1 without deltas)
  uint32_t head = 0, head_dim = 0, channels = 0;
  uint32_t layer = 0;
  uint32_t dest_token = 0;  // destination token of the frame's token 0
  uint32_t rope_off = 0;    // index of (token 0, pair 0) cos in the plan's RoPE array; sin follows cos
  uint32_t rope_pairs = 0;  // 0: no RoPE on this job's rows
  uint8_t kv = 0;
  uint8_t rotate = 0;
  uint8_t rope_neox = 0;
};

// Output element type codes (cachegen::DType values).
constexpr uint8_t kOutF32 = 0;
constexpr uint8_t kOutF16 = 1;
constexpr uint8_t kOutBF16 = 2;

// Where rows go: element strides like KVView (dim stride 1), optional pages.
struct DestDesc {
  int64_t s_layer = 0, s_kv = 0, s_token = 0, s_head = 0;
  uint32_t page_tokens = 0;  // 0: unpaged
  uint8_t dtype = kOutF16;
};

// Read-only data every job of a launch shares.
struct Inputs {
  const uint8_t* bytes = nullptr;      // containers / frames
  const uint16_t* freqs = nullptr;     // per-stream frequency tables
  const float* sigma_table = nullptr;  // 256 channel scales by code
  const float* rope = nullptr;         // cos/sin tables
  const float* values = nullptr;       // profile statistics, codebook levels, head transforms
  const uint32_t* indices = nullptr;   // table cycles and codebook level offsets
  const uint32_t* tables = nullptr;    // profile decode tables, kTableWords each
  const int64_t* pages = nullptr;      // page element offsets
  void* dst = nullptr;
  DestDesc dest;
};

// A job group's scratch memory (shared memory on the device): head_dim floats
// each for st, st_recent, mean, anchor, row, xform; per stream a 4096-entry slot ->
// symbol table, 256 (freq | cum << 16) entries and a ring of RingSize symbols.
struct Workspace {
  float *st, *st_recent, *mean, *anchor, *row, *xform;
  uint8_t* slot_sym[2];
  uint32_t* sym_info[2];
  uint32_t* ring[2];
};

// A ring holds the decoded symbols not yet used: less than one row plus one
// round of at most kGroupThreads lanes.
CG_HD inline uint32_t RingSize(uint32_t head_dim) { return head_dim + kGroupThreads; }

// Bytes of one group's Workspace, each piece 16-byte aligned.
CG_HD inline uint64_t Align16(uint64_t n) { return (n + 15) & ~uint64_t{15}; }
CG_HD inline uint64_t WorkspaceBytes(uint32_t head_dim) {
  return 6 * Align16(4ull * head_dim) + 2 * (Align16(kRansSlots) + Align16(4ull * kRansAlphabet) +
                                               Align16(4ull * RingSize(head_dim)));
}
CG_HD inline Workspace CarveWorkspace(uint8_t* base, uint32_t head_dim) {
  Workspace w;
  float** f[6] = {&w.st, &w.st_recent, &w.mean, &w.anchor, &w.row, &w.xform};
  for (float** p : f) {
    *p = reinterpret_cast<float*>(base);
    base += Align16(4ull * head_dim);
  }
  for (int s = 0; s < 2; ++s) {
    w.slot_sym[s] = base;
    base += Align16(kRansSlots);
    w.sym_info[s] = reinterpret_cast<uint32_t*>(base);
    base += Align16(4ull * kRansAlphabet);
    w.ring[s] = reinterpret_cast<uint32_t*>(base);
    base += Align16(4ull * RingSize(head_dim));
  }
  return w;
}


// Unsigned LEB128 of at most 10 bytes from [*pos, end), as ByteReader::Varint.
CG_HD inline bool ReadVarint(const uint8_t* bytes, uint64_t* pos, uint64_t end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= end) return false;
    const uint8_t b = bytes[(*pos)++];
    if (shift == 63 && b > 1) return false;
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

// Little-endian loads at any byte offset (payloads are not aligned).
CG_HD inline uint32_t Load16(const uint8_t* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
CG_HD inline uint32_t LaneState(const uint8_t* bytes, const StreamDesc& s, uint32_t lane) {
  const uint8_t* p = bytes + s.payload_off + 4ull * lane;
  return Load16(p) | (Load16(p + 2) << 16);
}
// Body word k (after the 2 * lanes state words).
CG_HD inline uint32_t BodyWord(const uint8_t* bytes, const StreamDesc& s, uint32_t k) {
  return Load16(bytes + s.payload_off + 2ull * (2ull * s.lanes + k));
}
CG_HD inline uint32_t BodyWords(const StreamDesc& s) { return s.payload_words - 2u * s.lanes; }

// The decode tables of a rANS stream, built by threads tid, tid + nthreads, ...
// slot_sym[slot] = s with cum[s] <= slot < cum[s] + freq[s]; info[s] = freq | cum << 16.
CG_HD inline void BuildTables(const uint16_t* freq, uint32_t escape, uint8_t* slot_sym, uint32_t* info, uint32_t tid,
                              uint32_t nthreads) {
  uint32_t cum = 0;
  for (uint32_t s = 0; s <= escape; ++s) {
    const uint32_t f = freq[s];
    if (tid == 0) info[s] = f | (cum << 16);
    for (uint32_t k = tid; k < f; k += nthreads) slot_sym[cum + k] = static_cast<uint8_t>(s);
    cum += f;
  }
}

// One rANS decode step of a lane (FORMAT.md "Payload"); the renormalising read
// is the caller's (it depends on the other lanes of the round).
CG_HD inline uint32_t RansStep(uint32_t* x, const uint8_t* slot_sym, const uint32_t* info) {
  const uint32_t slot = *x & (kRansSlots - 1);
  const uint32_t s = slot_sym[slot];
  const uint32_t fc = info[s];
  *x = (fc & 0xffffu) * (*x >> 12) + slot - (fc >> 16);
  return s;
}

// The tables a stream's symbols decode with: its inline table (built in the
// workspace), or for a table-form stream a cycle of profile tables.
struct StreamTables {
  const uint8_t* slot_sym = nullptr;
  const uint32_t* info = nullptr;
  const uint32_t* tables = nullptr;  // Inputs::tables
  const uint32_t* cycle = nullptr;   // table numbers, `period` of them; null: inline
  uint32_t period = 0;
};

// The profile table lane `lane` of a table-form stream's round takes, the
// round starting at cycle position cycle_at (< period).
CG_HD inline const uint32_t* CycleTable(const StreamTables& t, uint32_t cycle_at, uint32_t lane) {
  uint32_t at = cycle_at + lane;
  while (at >= t.period) at -= t.period;
  return t.tables + uint64_t{t.cycle[at]} * kTableWords;
}

// One decode step of lane `lane` of a round that starts at cycle position
// cycle_at; *escape receives the escape symbol of the table it used.
CG_HD inline uint32_t StreamStep(uint32_t* x, const StreamTables& t, const StreamDesc& s, uint32_t cycle_at,
                                 uint32_t lane, uint32_t* escape) {
  if (!t.cycle) {
    *escape = s.escape;
    return RansStep(x, t.slot_sym, t.info);
  }
  const uint32_t* table = CycleTable(t, cycle_at, lane);
  *escape = table[kRansSlots];
  const uint32_t e = table[*x & (kRansSlots - 1)];
  *x = (((e >> 8) & 0xfffu) + 1) * (*x >> 12) + (e >> 20);
  return e & 0xffu;
}

// The escape symbol of lane `lane`'s table in a round at cycle_at (any thread may ask).
CG_HD inline uint32_t LaneEscape(const StreamTables& t, const StreamDesc& s, uint32_t cycle_at, uint32_t lane) {
  return t.cycle ? CycleTable(t, cycle_at, lane)[kRansSlots] : s.escape;
}

// One fused multiply-add, rounded once, as std::fma (head_transform.cc).
CG_HD inline float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Reads the escape value of one escape symbol E: E + the next varint.
CG_HD inline bool ReadEscape(const uint8_t* bytes, const StreamDesc& s, uint32_t escape, uint32_t* esc_pos,
                             uint32_t* sym) {
  uint64_t pos = s.esc_off + *esc_pos, d = 0;
  if (!ReadVarint(bytes, &pos, s.esc_off + s.esc_len, &d) || d > 0xffffffffull - escape) return false;
  *esc_pos = static_cast<uint32_t>(pos - s.esc_off);
  *sym = escape + static_cast<uint32_t>(d);
  return true;
}

// Decoding progress of one stream, the same in every thread of a group.
struct StreamPos {
  uint64_t decoded = 0;  // symbols decoded into the ring
  uint32_t word = 0;     // body words read
  uint32_t ring_at = 0;  // ring index of symbol `decoded`
  uint32_t esc_pos = 0;  // escape bytes read
  uint32_t cycle_at = 0; // decoded % the stream's period (table-form streams)
};

CG_HD inline uint32_t RingWrap(uint32_t i, uint32_t ring) { return i >= ring ? i - ring : i; }

// Dequantization exactly as the CPU decoder: a multiply, then an add.
CG_HD inline float Dequant(uint32_t u, float pred, float st) {
  return pred + static_cast<float>(UnZigZag(u)) * st;
}

CG_HD inline int64_t RowOffset(const Inputs& in, uint32_t layer, uint32_t kv, uint32_t token, uint32_t head) {
  const DestDesc& d = in.dest;
  const int64_t tok = d.page_tokens == 0
                          ? int64_t{token} * d.s_token
                          : in.pages[token / d.page_tokens] + int64_t{token % d.page_tokens} * d.s_token;
  return int64_t{layer} * d.s_layer + int64_t{kv} * d.s_kv + tok + int64_t{head} * d.s_head;
}

CG_HD inline void StoreValue(const Inputs& in, int64_t elem, float v) {
  switch (in.dest.dtype) {
    case kOutF16: static_cast<uint16_t*>(in.dst)[elem] = F32ToF16(v); break;
    case kOutBF16: static_cast<uint16_t*>(in.dst)[elem] = F32ToBF16(v); break;
    default: static_cast<float*>(in.dst)[elem] = v; break;
  }
}

// One butterfly stage of the inverse Hadamard transform on row[0, n) (pairs
// k = tid, tid + nthreads, ... of n / 2), as hadamard.cc's Stage: the last
// stage multiplies by `scale`.
CG_HD inline void HadamardStage(float* row, uint32_t n, uint32_t len, bool last, float scale, uint32_t tid,
                                uint32_t nthreads) {
  for (uint32_t k = tid; k < n / 2; k += nthreads) {
    const uint32_t i = ((k & ~(len - 1)) << 1) | (k & (len - 1));
    const float x = row[i], y = row[i + len];
    if (last) {
      row[i] = (x + y) * scale;
      row[i + len] = (x - y) * scale;
    } else {
      row[i] = x + y;
      row[i + len] = x - y;
    }
  }
}

// RoPE of one head row, as RopeTable::Apply (forward): products rounded before the sum.
CG_HD inline void RopeRow(float* row, const float* cs, const float* sn, uint32_t pairs, bool neox, uint32_t tid,
                          uint32_t nthreads) {
  for (uint32_t i = tid; i < pairs; i += nthreads) {
    const uint32_t a = neox ? i : 2 * i;
    const uint32_t b = neox ? i + pairs : 2 * i + 1;
    const float x0 = row[a], x1 = row[b], c = cs[i], s = sn[i];
    const float p00 = x0 * c, p11 = x1 * s, p01 = x0 * s, p10 = x1 * c;
    row[a] = p00 - p11;
    row[b] = p01 + p10;
  }
}

// Runs one job. G is the thread group: G::kThreads threads, this one G::tid();
// G::Sync() orders shared-memory writes before reads; G::Lanes holds the
// per-lane rANS states (one per thread on the device, all on the host);
// G::Init/Round/Final run the lane-parallel parts of a stream. Streams are
// picked by template argument (0 anchor, 1 delta), so that on the device
// their state stays in registers.
template <typename G>
struct JobRunner {
  CG_HD JobRunner(G& group, const JobDesc& job, const Inputs& inputs, const Workspace& work)
      : g(group), j(job), in(inputs), w(work) {}
  G& g;
  const JobDesc& j;
  const Inputs& in;
  const Workspace& w;

  // Decoding state of one stream.
  struct Stream {
    typename G::Lanes lanes;
    StreamPos pos;
    uint64_t rows = 0;     // rows taken from the ring
    uint32_t row_at = 0;   // ring index of the next row
  };
  Stream anchor_, delta_;
  template <int S>
  CG_HD Stream& Of() {
    if constexpr (S == 0) return anchor_; else return delta_;
  }
  template <int S>
  CG_HD const StreamDesc& Desc() const {
    if constexpr (S == 0) return j.anchor; else return j.delta;
  }

  CG_HD uint32_t Run() {
    if (uint32_t e = LoadStats(); e != kJobOk) return e;
    Start<0>();
    Start<1>();
    g.Sync();
    for (uint32_t g0 = 0; g0 < j.quantized; g0 += j.group) {
      const uint32_t g1 = g0 + j.group < j.quantized ? g0 + j.group : j.quantized;
      if (uint32_t e = Row<0>(g0); e != kJobOk) return e;
      for (uint32_t t = g0 + 1; t < g1; ++t)
        if (uint32_t e = Row<1>(t); e != kJobOk) return e;
    }
    if (uint32_t e = Finish<0>(); e != kJobOk) return e;
    if (uint32_t e = Finish<1>(); e != kJobOk) return e;
    ExactTail();
    return kJobOk;
  }

  template <int S>
  CG_HD void Start() {
    const StreamDesc& sd = Desc<S>();
    if (sd.mode == kStreamRans)
      BuildTables(in.freqs + sd.table_off, sd.escape, w.slot_sym[S], w.sym_info[S], g.tid(), G::kThreads);
    if (Coded(sd.mode)) g.Init(Of<S>().lanes, in.bytes, sd);
  }

  // After the last row: every word, lane state and escape byte used exactly.
  template <int S>
  CG_HD uint32_t Finish() {
    const StreamDesc& sd = Desc<S>();
    if (!Coded(sd.mode)) return kJobOk;
    const Stream& st = Of<S>();
    const uint32_t which = uint32_t(S) << 8;  // the stream, for the message
    if (st.pos.word != BodyWords(sd)) return kJobPayloadLeft | which;
    if (!g.Final(st.lanes)) return kJobFinalState | which;
    if (sd.escape_used && st.pos.esc_pos != sd.esc_len) return kJobEscapeLeft | which;
    return kJobOk;
  }

  // Token t from the next row of stream S: the anchor of its group (S = 0,
  // predicted by the channel means) or a delta (S = 1, predicted by the
  // group's reconstructed anchor).
  template <int S>
  CG_HD uint32_t Row(uint32_t t) {
    const uint32_t D = j.head_dim, tid = g.tid(), nt = G::kThreads;
    const StreamDesc& sd = Desc<S>();
    Stream& st = Of<S>();
    const uint32_t ring = RingSize(D);
    if (Coded(sd.mode)) {
      if (uint32_t e = DecodeRow<S>(); e != kJobOk) return e | (uint32_t(S) << 8);
      g.Sync();
    }
    // Rows finished in w.row before the store.
    const bool row_pass = j.rotate || j.rope_pairs || j.transform_off != kNoOffset;
    const float* stt = t >= j.recent_begin ? w.st_recent : w.st;
    const float* pred = S == 0 ? w.mean : w.anchor;
    const int64_t base = RowOffset(in, j.layer, j.kv, j.dest_token + t, j.head);
    const uint32_t* level_at = in.indices + j.level_off[S];
    for (uint32_t d = tid; d < D; d += nt) {
      const uint32_t u = Coded(sd.mode) ? w.ring[S][RingWrap(st.row_at + d, ring)] : sd.constant;
      // With a codebook, as DequantLevels: the level, else q, times the step.
      const float v = u <= j.level_top && j.level_top ? pred[d] + in.values[level_at[d] + u] * stt[d]
                                                       : Dequant(u, pred[d], stt[d]);
      if (S == 0) w.anchor[d] = v;
      if (row_pass) {
        w.row[d] = v;
      } else {
        StoreValue(in, base + d, v);
      }
    }
    st.row_at = RingWrap(st.row_at + D, ring);
    g.Sync();
    if (row_pass) FinishRow(t, base, true);
    return kJobOk;
  }

  // Decodes rounds of stream S until its next row (head_dim symbols) is in
  // the ring. A round ends past the row when head_dim is not a multiple of
  // the lanes; the ring keeps those symbols for the next row.
  template <int S>
  CG_HD uint32_t DecodeRow() {
    const uint32_t D = j.head_dim;
    const StreamDesc& sd = Desc<S>();
    Stream& st = Of<S>();
    const uint64_t need = ++st.rows * uint64_t{D};
    const uint32_t ring = RingSize(D);
    StreamTables tables{w.slot_sym[S], w.sym_info[S]};
    if (sd.mode == kStreamTable) {
      tables.tables = in.tables;
      tables.cycle = in.indices + sd.cycle_off;
      tables.period = sd.period;
    }
    while (st.pos.decoded < need) {
      const uint64_t left = sd.n - st.pos.decoded;
      const uint32_t active = left < sd.lanes ? static_cast<uint32_t>(left) : sd.lanes;
      if (uint32_t e = g.Round(st.lanes, st.pos, in.bytes, sd, tables, w.ring[S], ring, active); e != kJobOk)
        return e;
      st.pos.decoded += active;
      st.pos.ring_at = RingWrap(st.pos.ring_at + active, ring);
      if (tables.cycle) st.pos.cycle_at = static_cast<uint32_t>((st.pos.cycle_at + active) % sd.period);
    }
    return kJobOk;
  }

  // Channel steps and means of this head (as ParseSectionHeader computes them).
  CG_HD uint32_t LoadStats() {
    const uint32_t D = j.head_dim, tid = g.tid(), nt = G::kThreads;
    if (j.stats_off != kNoOffset) {  // a profile's, resolved by the plan
      for (uint32_t d = tid; d < D; d += nt) {
        const float sigma = in.values[j.stats_off + d];
        w.st[d] = sigma * j.step;
        w.st_recent[d] = sigma * j.step_recent;
        w.mean[d] = in.values[j.stats_off + D + d];
      }
      g.Sync();
      return kJobOk;
    }
    for (uint32_t d = tid; d < D; d += nt) {
      const float sigma = in.sigma_table[in.bytes[j.sigma_off + d]];
      w.st[d] = sigma * j.step;
      w.st_recent[d] = sigma * j.step_recent;
    }
    uint32_t err = kJobOk;
    if (tid == 0) {
      uint64_t p = j.mean_off;
      for (uint32_t d = 0; d < D; ++d) {
        uint64_t z = 0;
        if (!ReadVarint(in.bytes, &p, j.mean_end, &z) || z > (uint64_t{1} << 31)) {
          err = kJobBadMean;
          break;
        }
        const float sigma = in.sigma_table[in.bytes[j.sigma_off + d]];
        w.mean[d] = static_cast<float>(UnZigZag(static_cast<uint32_t>(z))) * (sigma / 4.0f);
      }
    }
    g.Sync();
    return g.Any(err != kJobOk) ? kJobBadMean : kJobOk;
  }


  // Quantized rows (`coded`): inverse Hadamard or head transform; then RoPE
  // (keys) and the store.
  CG_HD void FinishRow(uint32_t t, int64_t base, bool coded) {
    const uint32_t D = j.head_dim, tid = g.tid(), nt = G::kThreads;
    if (coded && j.transform_off != kNoOffset) {
      // x = U y as HeadFromCoding: per output c a chain over r in order.
      const float* ut = in.values + j.transform_off;
      for (uint32_t c = tid; c < D; c += nt) {
        float acc = 0;
        for (uint32_t r = 0; r < D; ++r) acc = Fma(ut[uint64_t{r} * D + c], w.row[r], acc);
        w.xform[c] = acc;
      }
      g.Sync();
      for (uint32_t c = tid; c < D; c += nt) w.row[c] = w.xform[c];
      g.Sync();
    }
    if (coded && j.rotate && D >= 2) {
      for (uint32_t len = 1; len < D; len <<= 1) {
        HadamardStage(w.row, D, len, 2 * len == D, j.hadamard_scale, tid, nt);
        g.Sync();
      }
    }
    if (j.rope_pairs) {
      const float* cs = in.rope + j.rope_off + uint64_t{t} * j.rope_pairs;
      const float* sn = cs + uint64_t{j.tokens} * j.rope_pairs;
      RopeRow(w.row, cs, sn, j.rope_pairs, j.rope_neox, tid, nt);
      g.Sync();
    }
    for (uint32_t d = tid; d < D; d += nt) StoreValue(in, base + d, w.row[d]);
    g.Sync();
  }

  // Tokens [quantized, tokens): f16 as stored, RoPE'd for keys, never rotated.
  CG_HD void ExactTail() {
    const uint32_t D = j.head_dim, tid = g.tid(), nt = G::kThreads;
    for (uint32_t t = j.quantized; t < j.tokens; ++t) {
      const uint8_t* src = in.bytes + j.tail_off + 2 * (uint64_t{t - j.quantized} * j.channels + uint64_t{j.head} * D);
      const int64_t base = RowOffset(in, j.layer, j.kv, j.dest_token + t, j.head);
      if (!j.rope_pairs) {
        for (uint32_t d = tid; d < D; d += nt) StoreValue(in, base + d, F16ToF32(static_cast<uint16_t>(Load16(src + 2 * d))));
        continue;
      }
      for (uint32_t d = tid; d < D; d += nt) w.row[d] = F16ToF32(static_cast<uint16_t>(Load16(src + 2 * d)));
      g.Sync();
      FinishRow(t, base, false);
    }
  }
};

}  // namespace cachegen::gpu
