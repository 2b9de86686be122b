// The fast schedule of DecodeCacheGenSection (section_decoder.cc): the rANS
// rounds of a batch of heads' streams decoded in lockstep with AVX2, each
// round's 8 symbols dequantized (through the section's reconstruction
// codebook, if any), delta-reconstructed and stored from registers (or, with
// a profile's head transform, gathered into a row that is transformed back and
// stored), with no symbol buffer and no second pass.
//
// It takes what `profile train` makes by default (profile tables, per-class
// tables of channel classes, lloyd codebooks, learned head transforms, keys
// with RoPE) as well as profile-free frames; kFusedSchedule (section_format.h)
// lists what it takes, and it produces exactly the generic path's bytes.
// Anything else (Hadamard rotation; RoPE pairs across 8-dim blocks or strided
// dims without a transform; head_dim not a multiple of 8; one-lane streams)
// stays with the generic path.
#pragma once

#include <cstdint>
#include <span>

#include "codec/cachegen/section_coder.h"
#include "codec/rans.h"

namespace cachegen::internal {

// One 8-lane rANS stream of a batch, parsed, with where its symbols' table
// entries (form rans::TableForm::kZigZagValues) are: at table + slot, or, for
// a cycle of per-channel tables (channel classes), at table + dim_offset[d] +
// slot for a symbol of dim d (offsets in entries, one per head dim).
struct FusedStream {
  const uint32_t* table = nullptr;
  const int32_t* dim_offset = nullptr;
  uint32_t escape = 0;                   // the escape symbol, when all dims share the table
  const uint32_t* dim_escape = nullptr;  // per dim, with dim_offset
  const uint32_t* state = nullptr;       // 8 initial lane states
  std::span<const uint8_t> esc, payload;
};

// A section whose header has been read: per-channel means and steps (of the
// older and of the recent tokens) as the generic decoder computes them, and
// its codebook's levels.
struct FusedSection {
  const SectionLayout* layout = nullptr;
  const SectionSink* sink = nullptr;
  bool use_delta = false;
  const float* mean = nullptr;
  const float* st = nullptr;
  const float* st_recent = nullptr;
  // Codebook: a symbol u <= level_top of channel c in a stream of kind k
  // reconstructs at levels[level_offset[k * C + c] + u] steps; null: none.
  const float* levels = nullptr;
  const int32_t* level_offset = nullptr;
  uint32_t level_top = 0;
};

// Whether this CPU runs the fused schedule (AVX2, F16C, BMI2, and SIMD not
// switched off); which sections it takes: kFusedSchedule (section_format.h).
bool FusedAvailable();

// Decodes heads [head0, head0 + heads) whose streams are `streams` (per head
// its anchor stream, then with deltas its delta stream) into the sink.
// inline_tables: every stream's table is the `table` of consecutive
// rans::ParsedStreams (streams[k].table == streams[0].table + k ParsedStreams),
// which the plain form looks up at constant offsets.
// True when every row was written and every stream ended cleanly. False
// leaves the batch to the generic decoder, which the caller reruns on the
// same bytes (and which reports what was wrong); rows may be partly written
// then.
bool DecodeFusedBatch(const FusedSection& s, const FusedStream* streams, uint32_t head0, uint32_t heads,
                      bool inline_tables);

// Batches this thread decoded on the fused path (true returns of
// DecodeFusedBatch): lets tests check which path they exercised.
uint64_t FusedBatchesOnThisThread();

}  // namespace cachegen::internal
