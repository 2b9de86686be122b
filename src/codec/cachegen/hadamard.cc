#include "codec/cachegen/hadamard.h"

#include <cmath>

namespace cachegen {

void HadamardInPlace(float* v, uint32_t n) {
  for (uint32_t len = 1; len < n; len <<= 1) {
    for (uint32_t i = 0; i < n; i += 2 * len) {
      for (uint32_t j = i; j < i + len; ++j) {
        const float a = v[j], b = v[j + len];
        v[j] = a + b;
        v[j + len] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (uint32_t i = 0; i < n; ++i) v[i] *= scale;
}

}  // namespace cachegen
