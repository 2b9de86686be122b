// Automatic model profiles (src/engine/llama/auto_profile.h) on the tiny
// random-weight model: learned once from the model's own text, then read
// from the cache folder; a damaged cache file is not used.
#include "engine/llama/auto_profile.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "codec/cachegen/profile_data.h"
#include "random_model_fixture.h"

namespace cachegen {
namespace {

class AutoProfileTest : public TinyRandomModelTest {};

TEST_F(AutoProfileTest, SampledWindowsAreDeterministic) {
  auto a = engine::SampleModelWindows(*model_, 2, 40, 7);
  auto b = engine::SampleModelWindows(*model_, 2, 40, 7);
  auto c = engine::SampleModelWindows(*model_, 2, 40, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), 2u);
  for (const auto& w : *a) {
    ASSERT_EQ(w.size(), 40u);
    EXPECT_EQ(w[0], (*model_)->info().bos);
    for (int32_t t : w) EXPECT_LT(uint32_t(t), (*model_)->info().vocab);
  }
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST_F(AutoProfileTest, LearnsOnceThenReadsTheCache) {
  const std::string dir = ::testing::TempDir() + "/cachegen_auto_profile_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  engine::AutoProfileOptions o;
  o.model_path = path_;
  o.cache_dir = dir;
  o.windows = 2;  // small and quick; the defaults learn from 8 x (384 + 128)
  o.context = 64;
  o.continuation = 16;
  auto first = engine::AutoModelProfile(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->learned);
  EXPECT_TRUE(std::filesystem::exists(first->path));
  EXPECT_NE(first->source.find("text the model wrote itself"), std::string::npos) << first->source;
  const internal::ProfileData& d = first->profile->data();
  EXPECT_EQ(d.layers, (*model_)->info().layers);
  EXPECT_FALSE(d.sensitivity.empty());
  EXPECT_FALSE(d.curve_steps.empty());

  auto second = engine::AutoModelProfile(o);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->learned);
  EXPECT_EQ(second->profile->id(), first->profile->id());

  auto cached = engine::CachedModelProfile(o);
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_EQ(cached->profile->id(), first->profile->id());
  ProfileSet found;
  EXPECT_EQ(AddCachedProfiles(dir, found), 1u);
  EXPECT_EQ(found.Find(first->profile->id())->bytes(), first->profile->bytes());
  // A damaged cache file is not used: the cache has no profile of the model
  // (AutoModelProfile then learns it again, as the first time).
  std::ofstream(first->path, std::ios::binary | std::ios::trunc) << "not a profile";
  EXPECT_EQ(engine::CachedModelProfile(o).status().code(), StatusCode::kNotFound);
  ProfileSet none;
  EXPECT_EQ(AddCachedProfiles(dir, none), 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cachegen
