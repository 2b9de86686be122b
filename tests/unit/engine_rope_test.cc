#include "engine/rope.h"

#include <cmath>

#include <gtest/gtest.h>

#include "kv/synthetic.h"

namespace cachegen::engine {
namespace {

TEST(RopeTest, InverseUndoesAndValuesAreUntouched) {
  auto kv = SyntheticKV(KVShape{2, 2, 8, 5}, DType::kF32, 4);
  ASSERT_TRUE(kv.ok());
  const KVTensor orig = *kv;
  std::vector<int32_t> pos = {0, 1, 7, 100, 5000};
  for (bool neox : {false, true}) {
    RopeSpec r{neox, 8, 10000.0, 1.0};
    ASSERT_TRUE(RotateKeys(kv->view(), pos, r, false).ok());
    double moved = 0;
    for (uint32_t t = 1; t < 5; ++t) moved += std::fabs(kv->view().Get(0, KV::kKey, t, 0, 0) - orig.view().Get(0, KV::kKey, t, 0, 0));
    EXPECT_GT(moved, 0);
    // Position 0 is the identity; V never moves.
    EXPECT_EQ(kv->view().Get(1, KV::kKey, 0, 1, 3), orig.view().Get(1, KV::kKey, 0, 1, 3));
    EXPECT_EQ(kv->view().Get(1, KV::kValue, 4, 1, 3), orig.view().Get(1, KV::kValue, 4, 1, 3));
    ASSERT_TRUE(RotateKeys(kv->view(), pos, r, true).ok());
    for (uint32_t t = 0; t < 5; ++t)
      for (uint32_t d = 0; d < 8; ++d)
        EXPECT_NEAR(kv->view().Get(1, KV::kKey, t, 1, d), orig.view().Get(1, KV::kKey, t, 1, d), 1e-5);
  }
}

TEST(RopeTest, NormalRotatesAdjacentPairsByPosTimesFrequency) {
  KVTensor kv(KVShape{1, 1, 4, 1}, DType::kF32);
  for (uint32_t d = 0; d < 4; ++d) kv.view().Set(0, KV::kKey, 0, 0, d, d == 0 || d == 2 ? 1.0f : 0.0f);
  const int32_t pos = 3;
  ASSERT_TRUE(RotateKeys(kv.view(), std::span<const int32_t>(&pos, 1), RopeSpec{false, 4, 100.0, 1.0}, false).ok());
  // pair 0: theta = 3; pair 1: theta = 3 * 100^(-1/2) = 0.3
  EXPECT_NEAR(kv.view().Get(0, KV::kKey, 0, 0, 0), std::cos(3.0), 1e-6);
  EXPECT_NEAR(kv.view().Get(0, KV::kKey, 0, 0, 1), std::sin(3.0), 1e-6);
  EXPECT_NEAR(kv.view().Get(0, KV::kKey, 0, 0, 2), std::cos(0.3), 1e-6);
  EXPECT_NEAR(kv.view().Get(0, KV::kKey, 0, 0, 3), std::sin(0.3), 1e-6);
}

TEST(RopeTest, RejectsBadArguments) {
  KVTensor kv(KVShape{1, 1, 4, 2}, DType::kF32);
  std::vector<int32_t> pos = {0, 1};
  EXPECT_FALSE(RotateKeys(kv.view(), std::span<const int32_t>(pos).first(1), RopeSpec{false, 4}, false).ok());
  EXPECT_FALSE(RotateKeys(kv.view(), pos, RopeSpec{false, 6}, false).ok());
  EXPECT_FALSE(RotateKeys(kv.view(), pos, RopeSpec{false, 3}, false).ok());
  EXPECT_FALSE(RotateKeys(kv.view(), pos, RopeSpec{false, 4, 0.0}, false).ok());
}

}  // namespace
}  // namespace cachegen::engine
