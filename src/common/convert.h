// Row conversion between f32 and the KV element types, bit-identical to half.h's
// scalar F32ToF16 / F32ToBF16 (round to nearest even; NaN becomes the quiet
// NaN those functions produce), with AVX2/F16C versions chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cachegen/kv.h"

namespace cachegen {

// Writes n values of src to dst (contiguous elements of `dtype`).
void StoreRow(DType dtype, const float* src, size_t n, void* dst);

// Reads n contiguous elements of `dtype` at src (any byte address) into dst,
// bit-identical to half.h's F16ToF32 / BF16ToF32 (NaN payloads kept as is).
void LoadRow(DType dtype, const void* src, size_t n, float* dst);

}  // namespace cachegen
