// The thread groups that run gpu_core.h's jobs (JobRunner's G): the host's
// one thread (RunOnHost) and the device's warp (src/cuda/decoder.cu), whose
// warp intrinsics the tests also emulate on CPU threads. A stream round's
// renormalising reads and escape values go in lane order in both.
#pragma once

#include <cstdint>

#include "codec/cachegen/gpu_core.h"

namespace cachegen::gpu {

// The host's thread group: one thread runs every lane, in lane order, which
// is the order the device's ballot gives the renormalising reads.
struct HostGroup {
  static constexpr uint32_t kThreads = 1;
  struct Lanes {
    uint32_t x[kGroupThreads];
    uint32_t n;
  };
  uint32_t tid() const { return 0; }
  void Sync() const {}
  bool Any(bool v) const { return v; }
  void Init(Lanes& l, const uint8_t* bytes, const StreamDesc& s) const {
    l.n = s.lanes;
    for (uint32_t k = 0; k < s.lanes; ++k) l.x[k] = LaneState(bytes, s, k);
  }
  bool Final(const Lanes& l) const {
    for (uint32_t k = 0; k < l.n; ++k)
      if (l.x[k] != kRansL) return false;
    return true;
  }
  // Symbols p.decoded .. + active (lanes 0 .. active - 1) into the ring.
  uint32_t Round(Lanes& l, StreamPos& p, const uint8_t* bytes, const StreamDesc& s, const StreamTables& t,
                 uint32_t* ring, uint32_t ring_size, uint32_t active) const {
    const uint32_t words = BodyWords(s);
    for (uint32_t k = 0; k < active; ++k) {
      uint32_t escape = 0;
      uint32_t sym = StreamStep(&l.x[k], t, s, p.cycle_at, k, &escape);
      if (l.x[k] < kRansL) {
        if (p.word >= words) return kJobPayloadShort;
        l.x[k] = (l.x[k] << 16) | BodyWord(bytes, s, p.word++);
      }
      if (s.escape_used && sym == escape && !ReadEscape(bytes, s, escape, &p.esc_pos, &sym)) return kJobEscapeBad;
      ring[RingWrap(p.ring_at + k, ring_size)] = sym;
    }
    return kJobOk;
  }
};

CG_HD inline uint32_t Popc(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return static_cast<uint32_t>(__builtin_popcount(v));
#endif
}
CG_HD inline uint32_t LowestBit(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__ffs(v) - 1);
#else
  return static_cast<uint32_t>(__builtin_ctz(v));
#endif
}

// The device's thread group: one warp, over warp intrinsics W (lane(),
// Sync(), Ballot(bool) -> mask): the device's own (src/cuda/decoder.cu) or
// the tests' emulation on CPU threads. Lane j of a stream is thread j; the
// renormalising reads of a round go in lane order by ballot and prefix count,
// which is the order HostGroup reads them one by one.
template <typename W>
struct WarpGroup {
  static constexpr uint32_t kThreads = kGroupThreads;
  struct Lanes {
    uint32_t x;
  };
  W warp;
  CG_HD uint32_t tid() const { return warp.lane(); }
  CG_HD void Sync() const { warp.Sync(); }
  CG_HD bool Any(bool v) const { return warp.Ballot(v) != 0; }
  CG_HD void Init(Lanes& l, const uint8_t* bytes, const StreamDesc& s) const {
    // Threads without a lane hold L, so Final can test the whole warp.
    l.x = tid() < s.lanes ? LaneState(bytes, s, tid()) : kRansL;
  }
  CG_HD bool Final(const Lanes& l) const { return warp.Ballot(l.x != kRansL) == 0; }
  CG_HD uint32_t Round(Lanes& l, StreamPos& p, const uint8_t* bytes, const StreamDesc& s, const StreamTables& t,
                       uint32_t* ring, uint32_t ring_size, uint32_t active) const {
    const uint32_t lane = tid();
    const bool act = lane < active;
    uint32_t sym = 0, escape = 0;
    if (act) sym = StreamStep(&l.x, t, s, p.cycle_at, lane, &escape);
    const bool need = act && l.x < kRansL;
    const uint32_t mask = warp.Ballot(need);
    const uint32_t count = Popc(mask);
    if (p.word + count > BodyWords(s)) return kJobPayloadShort;  // the same in every thread
    if (need) l.x = (l.x << 16) | BodyWord(bytes, s, p.word + Popc(mask & ((1u << lane) - 1)));
    p.word += count;
    if (s.escape_used) {
      // Escape values are varints read in symbol order: every thread reads
      // each one (uniform control flow), the owning lane keeps it.
      for (uint32_t esc = warp.Ballot(act && sym == escape); esc; esc &= esc - 1) {
        uint32_t value = 0;
        const uint32_t owner = LowestBit(esc);
        if (!ReadEscape(bytes, s, LaneEscape(t, s, p.cycle_at, owner), &p.esc_pos, &value)) return kJobEscapeBad;
        if (lane == owner) sym = value;
      }
    }
    if (act) ring[RingWrap(p.ring_at + lane, ring_size)] = sym;
    return kJobOk;
  }
};

}  // namespace cachegen::gpu
