// Orthonormal Walsh–Hadamard rotation of one head's channels.
//
// Keys have a few outlier channels carrying most of the energy; rotating each
// head by a normalised Hadamard matrix spreads them over all channels, so one
// per-channel step size fits better. The transform is its own inverse.
#pragma once

#include <cstdint>

namespace cachegen {

inline bool IsPowerOfTwo(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

// In place, n a power of two: v <- H_n v / sqrt(n).
void HadamardInPlace(float* v, uint32_t n);

}  // namespace cachegen
