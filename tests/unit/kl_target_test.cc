// KL targets in rate control (CodecConfig::max_kl) and the encoder's KL
// predictions (FrameStats::predicted_kl, EncodeStats::level_predicted_kl).
#include <cmath>

#include <gtest/gtest.h>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "kv/synthetic.h"

namespace cachegen {
namespace {

const KVShape kShape{2, 2, 16, 128};

KVTensor Context(uint64_t seed) { return *SyntheticKV(kShape, DType::kF16, seed); }

// A profile of kShape with the given sensitivities and, optionally, a curve.
std::shared_ptr<const Profile> ProfileWith(std::vector<float> w, std::vector<float> steps = {},
                                           std::vector<float> kl = {}) {
  const KVTensor train = Context(7);
  const KVView views[] = {train.view()};
  ProfileTrainOptions o;
  o.key_transform = false;
  auto p = Profile::Train(views, CodecConfig{}, o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto q = (*p)->WithSensitivity(w, SensitivityCurve{steps, kl, 0, {}, {}});
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  if (!q.ok()) return nullptr;
  return *q;
}

Result<EncodeStats> EncodeWith(const CodecConfig& cfg, const KVTensor& kv) {
  CG_ASSIGN_OR_RETURN(Encoder enc, Encoder::Create(cfg));
  EncodeStats stats;
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, enc.Encode(kv.view(), &stats));
  const ProfileSet profiles(cfg.profile);
  CG_ASSIGN_OR_RETURN(Decoder dec, Decoder::Open(bytes, &profiles));
  CG_RETURN_IF_ERROR(dec.Decode(DType::kF32).status());
  return stats;
}

TEST(KlTarget, NeedsAProfileWithSensitivities) {
  CodecConfig cfg;
  cfg.max_kl = 1e-3;
  EXPECT_EQ(Encoder::Create(cfg).status().code(), StatusCode::kInvalidArgument);
  const KVTensor train = Context(7);
  const KVView views[] = {train.view()};
  ProfileTrainOptions o;
  o.key_transform = false;
  auto bare = Profile::Train(views, CodecConfig{}, o);
  ASSERT_TRUE(bare.ok());
  cfg.profile = *bare;
  const Status st = Encoder::Create(cfg).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sensitivities"), std::string::npos) << st.ToString();
  cfg.profile = ProfileWith({1, 1, 1, 1});
  EXPECT_TRUE(Encoder::Create(cfg).ok());
  cfg.bits_per_value = 2;  // two targets
  EXPECT_EQ(Encoder::Create(cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.bits_per_value = 0;
  cfg.max_kl = -1;
  EXPECT_EQ(Encoder::Create(cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.max_kl = NAN;
  EXPECT_EQ(Encoder::Create(cfg).status().code(), StatusCode::kInvalidArgument);
}

// Each level predicts its target (the previous level's times kLevelKlRatio),
// and a looser target costs fewer bits.
TEST(KlTarget, LevelsPredictTheirTargets) {
  CodecConfig cfg;
  cfg.profile = ProfileWith({1e-3f, 1e-2f, 2e-3f, 5e-3f});
  cfg.max_kl = 1e-4;
  cfg.levels = 3;
  cfg.chunk_tokens = 64;
  auto stats = EncodeWith(cfg, Context(8));
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ASSERT_EQ(stats->level_predicted_kl.size(), 3u);
  for (uint32_t l = 0; l < 3; ++l) {
    const double target = 1e-4 * std::pow(kLevelKlRatio, l);
    EXPECT_NEAR(stats->level_predicted_kl[l] / target, 1, 1e-3) << l;
    if (l > 0) {
      EXPECT_LT(stats->level_bits_per_value[l], stats->level_bits_per_value[l - 1]) << l;
    }
  }
  for (const FrameStats& f : stats->frames) EXPECT_GE(f.predicted_kl, 0);
}

// With a curve the prediction follows it: a section whose KL saturates early
// gets coarse steps for a loose target, and the prediction still meets it.
TEST(KlTarget, CurvePredictionMeetsTheTarget) {
  const std::vector<float> steps = {0.25f, 1, 4};
  const std::vector<float> kl = {1e-5f, 1e-4f, 4e-4f,  1e-4f, 1e-3f, 1e-3f,  // layer 0: V saturates
                                 2e-5f, 2e-4f, 2e-3f,  1e-5f, 2e-4f, 3e-3f};
  CodecConfig cfg;
  cfg.profile = ProfileWith({1e-4f, 1e-3f, 2e-4f, 2e-4f}, steps, kl);
  for (double target : {1e-5, 1e-4, 1e-3}) {
    cfg.max_kl = target;
    auto stats = EncodeWith(cfg, Context(9));
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_NEAR(stats->level_predicted_kl[0] / target, 1, 1e-3) << target;
  }
  // Beyond what coding nothing would cost (the curves' last values sum to
  // 6.4e-3): the coarsest steps, predicted at that sum.
  cfg.max_kl = 1;
  auto stats = EncodeWith(cfg, Context(9));
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_NEAR(stats->level_predicted_kl[0], 4e-4 + 1e-3 + 2e-3 + 3e-3, 1e-6);
}

// A bits target also reports the prediction when the profile has
// sensitivities; without a profile there is none.
TEST(KlTarget, BitsTargetsReportThePrediction) {
  CodecConfig cfg;
  cfg.bits_per_value = 2;
  auto plain = EncodeWith(cfg, Context(10));
  ASSERT_TRUE(plain.ok());
  EXPECT_LT(plain->level_predicted_kl[0], 0);
  for (const FrameStats& f : plain->frames) EXPECT_LT(f.predicted_kl, 0);
  cfg.profile = ProfileWith({1e-3f, 1e-2f, 2e-3f, 5e-3f});
  auto low = EncodeWith(cfg, Context(10));
  cfg.bits_per_value = 4;
  auto high = EncodeWith(cfg, Context(10));
  ASSERT_TRUE(low.ok() && high.ok());
  EXPECT_GT(low->level_predicted_kl[0], 0);
  EXPECT_LT(high->level_predicted_kl[0], low->level_predicted_kl[0]);
}

}  // namespace
}  // namespace cachegen
