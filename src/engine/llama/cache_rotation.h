// llama.cpp's Hadamard-rotated cache storage (CacheRotationOf in
// cachegen/llama_engine.h), undone and redone on captured KV.
#pragma once

#include "cachegen/kv.h"
#include "cachegen/llama_engine.h"

namespace cachegen::engine {

// Multiplies every head's K dims in blocks of r.k_block, and V dims in
// blocks of r.v_block, by the orthonormal Sylvester-order Walsh-Hadamard
// matrix of that size (the one llama.cpp builds: H = H^T, H H = I, so the
// same call rotates and rotates back). A block of 0 leaves that part.
// Values are read and written as float (the view's dtype keeps its rounding).
void ApplyCacheRotation(const CacheRotation& r, const KVView& kv);

}  // namespace cachegen::engine
