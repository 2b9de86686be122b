// The lloyd quantizer's choice (section_kernels.h): thresholds built from a
// codebook and a rate term pick, for every value, the magnitude on its side
// that minimises squared error + cost over 0..M+1, as a search over every
// candidate would; beyond M + 1 the plain rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codec/cachegen/section_format.h"
#include "codec/cachegen/section_kernels.h"
#include "common/simd.h"

namespace cachegen {
namespace {

// The least (v - level)^2 + cost over the magnitudes 0..M+1 on v's side.
float LeastCost(float v, const std::vector<float>& levels, const std::vector<float>& cost, uint32_t M) {
  float least = INFINITY;
  for (uint32_t m = 0; m <= M + 1; ++m) {
    const int32_t q = v < 0 ? -int32_t(m) : int32_t(m);
    const float level = m <= M ? levels[ZigZag(q)] : float(q);
    least = std::min(least, (v - level) * (v - level) + cost[ZigZag(q)]);
  }
  return least;
}

TEST(SectionKernels, LloydChoiceIsTheLeastCost) {
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (bool simd_on : {false, true}) {
    simd::SetEnabled(simd_on);
    for (uint32_t M = 1; M <= kMaxCodebookLevels; ++M)
      for (int trial = 0; trial < 20; ++trial) {
        // Levels near their integers (ordered), costs up to a few bits' worth.
        std::vector<float> levels(2 * M + 1), cost(2 * M + 3), thr(2 * (M + 1));
        levels[0] = 0;
        for (uint32_t u = 1; u <= 2 * M; ++u) levels[u] = static_cast<float>(UnZigZag(u)) + 0.45f * unit(rng);
        for (float& c : cost) c = (trial % 4 == 0 ? 2.0f : 0.4f) * std::abs(unit(rng));
        LloydThresholds(levels.data(), M, cost.data(), thr.data());
        const uint32_t n = 64;
        std::vector<float> row(n), pred(n, 0.0f), st(n, 1.0f), inv(n, 1.0f), rec(n), level(n);
        std::vector<int32_t> q(n);
        for (float& v : row) v = float(M + 3) * unit(rng);
        std::vector<float> thr_rows(2 * (M + 1) * size_t{n});
        for (uint32_t i = 0; i < 2 * (M + 1); ++i)
          for (uint32_t c = 0; c < n; ++c) thr_rows[i * n + c] = thr[i];
        const LloydRowInput in{row.data(), pred.data(), st.data(), inv.data(), n, levels.data(), M, thr_rows.data(), n};
        LloydRow(in, q.data(), rec.data(), level.data());
        for (uint32_t c = 0; c < n; ++c) {
          const float v = row[c];
          const std::string at = "M " + std::to_string(M) + " v " + std::to_string(v);
          const int32_t rounded = QuantizeValue(v, 1.0f);
          if (uint32_t(std::abs(rounded)) > M + 1) {
            EXPECT_EQ(q[c], rounded) << at;
            continue;
          }
          EXPECT_TRUE(q[c] == 0 || (q[c] < 0) == (v < 0)) << at;
          const float chosen = (v - level[c]) * (v - level[c]) + cost[ZigZag(q[c])];
          EXPECT_LE(chosen, LeastCost(v, levels, cost, M) + 1e-4f) << at << " q " << q[c];
          EXPECT_EQ(level[c], uint32_t(std::abs(q[c])) <= M ? levels[ZigZag(q[c])] : float(q[c])) << at;
        }
      }
  }
  simd::SetEnabled(true);
}

}  // namespace
}  // namespace cachegen
