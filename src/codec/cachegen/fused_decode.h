// The fast path of DecodeCacheGenSection (section_coder.cc): the rANS rounds
// of a batch of heads' streams decoded in lockstep with AVX2, each round's 8
// symbols dequantized, delta-reconstructed, RoPE'd (keys) and stored from
// registers, with no symbol buffer and no second pass. It covers the common
// layouts (no Hadamard rotation; no RoPE, or RoPE whose pairs lie in whole
// 8-dim blocks; delta groups of 2 or more tokens, or none; head_dim a multiple
// of 8; f16, bf16 or f32 rows with contiguous dims; every stream 8-lane rANS)
// and produces exactly the generic path's bytes; anything else stays with the
// generic path.
#pragma once

#include <cstdint>

#include "codec/cachegen/section_coder.h"
#include "codec/rans.h"

namespace cachegen::internal {

// A section whose header has been read: per-channel means and steps (of the
// older and of the recent tokens) as the generic decoder computes them.
struct FusedSection {
  const SectionLayout* layout = nullptr;
  const SectionSink* sink = nullptr;
  bool use_delta = false;
  const float* mean = nullptr;
  const float* st = nullptr;
  const float* st_recent = nullptr;
};

// Whether sections of this layout can take the fused path into this sink.
bool FusedApplies(const SectionLayout& l, const SectionSink& sink, bool use_delta);

// Decodes heads [head0, head0 + heads) whose streams are parsed in the
// consecutive `streams` (per head its anchor stream, then with deltas its
// delta stream; table form rans::TableForm::kZigZagValues) into the sink.
// True when every row was written and every stream ended cleanly. False leaves the batch to the generic decoder, which the caller reruns on
// the same bytes (and which reports what was wrong); rows may be partly
// written then. Streams' states are consumed either way.
bool DecodeFusedBatch(const FusedSection& s, const rans::ParsedStream* streams, uint32_t head0, uint32_t heads);

// Batches this thread decoded on the fused path (true returns of
// DecodeFusedBatch): lets tests check which path they exercised.
uint64_t FusedBatchesOnThisThread();

}  // namespace cachegen::internal
