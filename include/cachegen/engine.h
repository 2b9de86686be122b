// Engine adapters: move one sequence's KV cache between an inference engine and
// cachegen KV tensors, so the codec never sees an engine's own layout. An
// adapter for llama.cpp is in cachegen/llama_engine.h; paged engines (vLLM
// style) implement the same two calls over their block tables.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {

// A captured sequence: its KV, tokens in cache order, and each token's position.
struct CapturedKV {
  KVTensor kv;
  std::vector<int32_t> positions;
};

class EngineAdapter {
 public:
  virtual ~EngineAdapter() = default;

  // Copies the KV of sequence `seq` out of the engine. kNotFound when the
  // sequence holds no tokens; kUnsupported for cache layouts the adapter does
  // not handle (the message says which).
  virtual Result<CapturedKV> Capture(int32_t seq) = 0;

  // Replaces sequence `seq`'s KV with `kv` (any dtype; rounded to the engine's
  // cache type). `positions`: one per token, or empty for 0, 1, 2, ... The
  // shape must match the engine's layers, KV heads and head dim.
  virtual Status Inject(int32_t seq, const KVView& kv, std::span<const int32_t> positions = {}) = 0;
};

}  // namespace cachegen
