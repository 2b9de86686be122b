// ggml's quantizers behind GgmlQuantizer: what Dequantize gives, Quantize
// turns back into the same blocks, for every quantized cache type. ggml's own
// iq4_nl quantizer alone does not (it searches a scale anew).
#include "engine/llama/ggml_quantizer.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace cachegen::engine {
namespace {

TEST(GgmlQuantizerTest, DequantizedBlocksQuantizeBackUnchanged) {
  const GgmlQuantizer& q = LlamaGgmlQuantizer();
  constexpr size_t kValues = 64 * 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kValues);
  for (size_t i = 0; i < kValues; ++i) x[i] = normal(rng) * static_cast<float>(1 + (i / 64) % 7);
  for (int32_t id : {kGgmlQ8_0, kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlIQ4_NL}) {
    const GgmlCacheType* t = FindGgmlCacheType(id);
    ASSERT_NE(t, nullptr);
    SCOPED_TRACE(t->name);
    std::vector<uint8_t> blocks(kValues / t->block * t->block_bytes), again(blocks.size());
    std::vector<float> y(kValues), z(kValues);
    q.Quantize(id, x.data(), blocks.data(), kValues);
    q.Dequantize(id, blocks.data(), y.data(), kValues);
    q.Quantize(id, y.data(), again.data(), kValues);
    EXPECT_EQ(blocks, again);
    q.Dequantize(id, again.data(), z.data(), kValues);
    EXPECT_EQ(std::memcmp(y.data(), z.data(), kValues * sizeof(float)), 0);
    // Quantization error stays at the type's scale: these are real quantizers.
    double err = 0, energy = 0;
    for (size_t i = 0; i < kValues; ++i) {
      err += double(x[i] - y[i]) * (x[i] - y[i]);
      energy += double(x[i]) * x[i];
    }
    EXPECT_LT(err / energy, id == kGgmlQ8_0 ? 1e-4 : 2e-2);
    EXPECT_GT(err, 0.0);
  }
}

}  // namespace
}  // namespace cachegen::engine
