#include "codec/cachegen/hadamard.h"

#include <cmath>

namespace cachegen {
namespace {

// One butterfly stage on blocks of 2*len: (a, b) -> (a + b, a - b), times
// `scale` when given (the last stage). Written over two non-overlapping
// pointers so the compiler vectorizes the inner loop for len >= 4.
inline void Stage(float* v, uint32_t n, uint32_t len, const float* scale) {
  for (uint32_t i = 0; i < n; i += 2 * len) {
    float* __restrict a = v + i;
    float* __restrict b = v + i + len;
    if (scale) {
      const float s = *scale;
      for (uint32_t k = 0; k < len; ++k) {
        const float x = a[k], y = b[k];
        a[k] = (x + y) * s;
        b[k] = (x - y) * s;
      }
    } else {
      for (uint32_t k = 0; k < len; ++k) {
        const float x = a[k], y = b[k];
        a[k] = x + y;
        b[k] = x - y;
      }
    }
  }
}

}  // namespace

void HadamardInPlace(float* v, uint32_t n) {
  if (n < 2) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (uint32_t len = 1; len < n; len <<= 1) Stage(v, n, len, 2 * len == n ? &scale : nullptr);
}

}  // namespace cachegen
