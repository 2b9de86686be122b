#include "engine/llama/ggml_quantizer.h"

#include <ggml.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace cachegen::engine {
namespace {

constexpr int kBlock = 32;

// iq4_nl block (ggml-common.h of the pinned release): f16 scale d, then 16
// bytes of 4-bit codebook indices, value j in the low nibble of byte j % 16
// for j < 16 and in the high nibble for j >= 16; value j = d * codebook[index].
constexpr size_t kIq4nlBytes = 18;

// iq4_nl's 16 codebook values, read back through ggml's own dequantizer
// (a block with scale 1 and indices 0..15) rather than copied from ggml.
const std::array<float, 16>& Iq4nlCodebook() {
  static const std::array<float, 16> book = [] {
    uint8_t block[kIq4nlBytes] = {};
    const uint16_t one = 0x3c00;  // f16 1.0
    std::memcpy(block, &one, 2);
    for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j);  // values 0..15: indices 0..15
    float v[kBlock];
    ggml_get_type_traits(GGML_TYPE_IQ4_NL)->to_float(block, v, kBlock);
    std::array<float, 16> out{};
    std::copy(v, v + 16, out.begin());
    return out;
  }();
  return book;
}

// ggml's iq4_nl quantizer searches for a scale, and from values an iq4_nl
// block decodes to it may pick another one: quantizing what Dequantize gave
// would not give back the cache's blocks. This finds a block that decodes to
// `x` exactly when there is one: the scale is one of the f16 values nearest
// x_max / codebook[i]. False when none does (then ggml's block stays).
bool ExactIq4nl(const float* x, uint8_t* block) {
  const auto& book = Iq4nlCodebook();
  int imax = 0;
  for (int j = 1; j < kBlock; ++j) {
    if (std::fabs(x[j]) > std::fabs(x[imax])) imax = j;
  }
  for (float k : book) {
    if (k == 0.0f) continue;
    const ggml_fp16_t h0 = ggml_fp32_to_fp16(x[imax] / k);
    for (int step = -1; step <= 1; ++step) {
      const ggml_fp16_t h = static_cast<ggml_fp16_t>(h0 + step);
      const float d = ggml_fp16_to_fp32(h);
      uint8_t candidate[kIq4nlBytes] = {};
      std::memcpy(candidate, &h, 2);
      bool ok = true;
      for (int j = 0; j < kBlock && ok; ++j) {
        int found = -1;
        for (int i = 0; i < 16 && found < 0; ++i) {
          if (d * book[static_cast<size_t>(i)] == x[j]) found = i;
        }
        ok = found >= 0;
        if (ok) candidate[2 + j % 16] |= static_cast<uint8_t>(j < 16 ? found : found << 4);
      }
      if (!ok) continue;
      float back[kBlock];
      ggml_get_type_traits(GGML_TYPE_IQ4_NL)->to_float(candidate, back, kBlock);
      if (std::memcmp(back, x, sizeof back) == 0) {
        std::memcpy(block, candidate, kIq4nlBytes);
        return true;
      }
    }
  }
  return false;
}

class GgmlBlockQuantizer final : public GgmlQuantizer {
 public:
  void Dequantize(int32_t type, const uint8_t* src, float* dst, size_t n) const override {
    ggml_get_type_traits(static_cast<ggml_type>(type))->to_float(src, dst, static_cast<int64_t>(n));
  }

  void Quantize(int32_t type, const float* src, uint8_t* dst, size_t n) const override {
    const auto t = static_cast<ggml_type>(type);
    ggml_quantize_chunk(t, src, dst, 0, 1, static_cast<int64_t>(n), nullptr);
    if (t != GGML_TYPE_IQ4_NL) return;  // the others give back dequantized blocks as they were
    float back[kBlock];
    for (size_t b = 0; b < n / kBlock; ++b) {
      uint8_t* block = dst + b * kIq4nlBytes;
      const float* x = src + b * kBlock;
      ggml_get_type_traits(t)->to_float(block, back, kBlock);
      if (std::memcmp(back, x, sizeof back) != 0) ExactIq4nl(x, block);
    }
  }
};

}  // namespace

const GgmlQuantizer& LlamaGgmlQuantizer() {
  static const GgmlBlockQuantizer q;
  return q;
}

}  // namespace cachegen::engine
