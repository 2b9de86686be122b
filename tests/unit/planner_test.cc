// LevelPlanner: level choice against deadlines, upgrades, recompute fallback.
#include "cachegen/planner.h"

#include <gtest/gtest.h>

namespace cachegen {
namespace {

// n chunks of 256 tokens; level l costs base * 0.75^l bytes.
std::vector<PlanChunk> Chunks(uint32_t n, uint64_t base = 1000000, int levels = 4) {
  std::vector<PlanChunk> v(n);
  for (auto& c : v) {
    c.tokens = 256;
    double b = static_cast<double>(base);
    for (int l = 0; l < levels; ++l, b *= 0.75) c.level_bytes.push_back(static_cast<uint64_t>(b));
  }
  return v;
}

PlannerOptions Opts(double deadline_s, double bw = 0) {
  PlannerOptions o;
  o.deadline_s = deadline_s;
  o.initial_bandwidth_bytes_s = bw;
  o.safety = 1.0;
  o.reserve = 0;
  return o;
}

TEST(Planner, UnknownBandwidthProbesFinest) {
  LevelPlanner p(Chunks(4), Opts(1.0));
  Plan plan = p.Replan(0, 0, 0);
  ASSERT_EQ(plan.decisions.size(), 4u);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 0);
  EXPECT_FALSE(plan.feasible);
}

TEST(Planner, LooseDeadlineGivesFinest) {
  LevelPlanner p(Chunks(8), Opts(10.0, 1e7));  // 8 MB at 10 MB/s = 0.8 s << 10 s
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 0);
  EXPECT_NEAR(plan.expected_s, 0.8, 1e-9);
}

TEST(Planner, NeverCoarserThanBestFittingFixedLevel) {
  // For a sweep of deadlines, the plan's levels are all <= the finest fixed
  // level that fits, and its bytes fit the budget.
  const auto chunks = Chunks(16);
  for (double deadline = 0.5; deadline < 2.0; deadline += 0.05) {
    LevelPlanner p(chunks, Opts(deadline, 1e7));
    Plan plan = p.Replan(0, 0, 0);
    int best_fixed = -1;
    for (int L = 0; L < 4; ++L) {
      uint64_t total = 0;
      for (const auto& c : chunks) total += c.level_bytes[L];
      if (static_cast<double>(total) / 1e7 <= deadline) {
        best_fixed = L;
        break;
      }
    }
    uint64_t bytes = 0;
    for (uint32_t c = 0; c < chunks.size(); ++c) {
      ASSERT_GE(plan.decisions[c].level, 0) << deadline;
      bytes += chunks[c].level_bytes[plan.decisions[c].level];
      if (best_fixed >= 0) {
        EXPECT_LE(plan.decisions[c].level, best_fixed) << deadline;
      }
    }
    if (best_fixed >= 0) {
      EXPECT_TRUE(plan.feasible) << deadline;
      EXPECT_LE(static_cast<double>(bytes) / 1e7, deadline + 1e-9) << deadline;
    } else {
      EXPECT_FALSE(plan.feasible) << deadline;
    }
  }
}

TEST(Planner, UpgradesEarliestChunksWithSlack) {
  // All at level 1 = 12 * 0.75 MB = 9 MB; deadline allows 9.5 MB -> two
  // chunks (0.25 MB each) upgrade to level 0, the first two.
  LevelPlanner p(Chunks(12), Opts(0.95, 1e7));
  Plan plan = p.Replan(0, 0, 0);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.decisions[0].level, 0);
  EXPECT_EQ(plan.decisions[1].level, 0);
  EXPECT_EQ(plan.decisions[2].level, 1);
  EXPECT_EQ(plan.decisions[11].level, 1);
}

TEST(Planner, ReplanAccountsForElapsedAndOutstanding) {
  LevelPlanner p(Chunks(8), Opts(1.0, 1e7));
  EXPECT_EQ(p.Replan(0, 0, 0).decisions[7].level, 0);
  // Half the time gone and 2 MB still in flight: 6 chunks in 3 MB -> level 3
  // (2.53 MB) plus three upgrades to level 2 (0.14 MB each).
  Plan late = p.Replan(2, 0.5, 2000000);
  ASSERT_EQ(late.decisions.size(), 6u);
  EXPECT_EQ(late.first, 2u);
  EXPECT_TRUE(late.feasible);
  EXPECT_EQ(late.decisions[0].level, 2);
  EXPECT_EQ(late.decisions[2].level, 2);
  EXPECT_EQ(late.decisions[3].level, 3);
  EXPECT_FALSE(p.Replan(2, 0.7, 2000000).feasible);  // 1 MB left: not even level 3
  Plan ok = p.Replan(2, 0.2, 1000000);  // 8 MB - 1 MB outstanding >= 6 MB at level 0
  EXPECT_TRUE(ok.feasible);
  for (auto d : ok.decisions) EXPECT_LE(d.level, 0);
}

TEST(Planner, BandwidthEstimateIsSmoothed) {
  PlannerOptions o = Opts(1.0);
  o.smoothing = 0.5;
  LevelPlanner p(Chunks(2), o);
  EXPECT_EQ(p.bandwidth(), 0);
  p.OnDelivered(1000, 1.0);
  EXPECT_DOUBLE_EQ(p.bandwidth(), 1000);
  p.OnDelivered(3000, 1.0);
  EXPECT_DOUBLE_EQ(p.bandwidth(), 2000);
  p.OnDelivered(5000, 0);  // ignored
  EXPECT_DOUBLE_EQ(p.bandwidth(), 2000);
  p.OnDelivered(500, 1.0);  // a drop is taken at once
  EXPECT_DOUBLE_EQ(p.bandwidth(), 500);
}

TEST(Planner, DecodeTimesPerLevelAndScaledForUnseenLevels) {
  LevelPlanner p(Chunks(4), Opts(1.0, 1e9));
  EXPECT_EQ(p.DecodeSeconds(0, 0), 0) << "unknown before any chunk was processed";
  p.OnProcessed(0.010, 0);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 0), 0.010);
  // Level 3 not seen: level 0's time scaled by the bytes (0.42 MB vs 1 MB).
  EXPECT_NEAR(p.DecodeSeconds(1, 3), 0.010 * 0.421875, 1e-12);
  p.OnProcessed(0.008, 3);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 0.008);
  EXPECT_NEAR(p.DecodeSeconds(1, 2), 0.008 * 0.5625 / 0.421875, 1e-12) << "nearest seen level";
}

TEST(Planner, DecodeBoundTransfersPickFasterDecodingLevels) {
  // A fast link (4 MB in 4 ms) but 100 ms of decode per level-0 chunk and
  // 50 ms per level-3 chunk (levels 1 and 2 scaled from the nearest: 75 and
  // 67 ms): with 0.21 s left only level 3 fits 4 chunks.
  LevelPlanner p(Chunks(4), Opts(0.21, 1e9));
  EXPECT_EQ(p.Replan(0, 0, 0).decisions[0].level, 0) << "no decode times known yet";
  p.OnProcessed(0.100, 0);
  p.OnProcessed(0.050, 3);
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 3);
  // Decode already ahead (pending) counts too: nothing fits then.
  EXPECT_FALSE(p.Replan(0, 0, 0, 0.2).feasible);
}

TEST(Planner, RecomputesLateChunksWhenCheaper) {
  // 8 chunks, coarsest 0.42 MB each = 3.4 MB at 1 MB/s = 3.4 s; deadline 2 s.
  // Recompute at 2000 tokens/s = 0.128 s per chunk < 0.42 s fetch: five late
  // chunks recomputed (3 * 0.42 + 5 * 0.128 = 1.9 s).
  PlannerOptions o = Opts(2.0, 1e6);
  o.recompute_tokens_per_s = 2000;
  LevelPlanner p(Chunks(8), o);
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  int recomputed = 0;
  bool seen_recompute = false;
  for (auto d : plan.decisions) {
    if (d.recompute()) {
      ++recomputed;
      seen_recompute = true;
    } else {
      EXPECT_FALSE(seen_recompute) << "recompute is chosen for the latest chunks";
    }
  }
  EXPECT_EQ(recomputed, 5);
  EXPECT_LE(plan.expected_s, 2.0);
}

TEST(Planner, NoRecomputeWhenMoreExpensiveOrUnsupported) {
  PlannerOptions o = Opts(2.0, 1e6);
  o.recompute_tokens_per_s = 100;  // 2.56 s per chunk: worse than fetching
  LevelPlanner slow(Chunks(8), o);
  Plan plan = slow.Replan(0, 0, 0);
  EXPECT_FALSE(plan.feasible);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 3);
  o.recompute_tokens_per_s = 0;
  LevelPlanner none(Chunks(8), o);
  for (auto d : none.Replan(0, 0, 0).decisions) EXPECT_EQ(d.level, 3);
}

TEST(Planner, MissingLevelsResolveAndEmptyChunksRecompute) {
  auto chunks = Chunks(3);
  chunks[1].level_bytes[0] = 0;  // level 0 absent: use level 1
  chunks[2].level_bytes.assign(4, 0);  // nothing stored
  PlannerOptions o = Opts(10.0, 1e7);
  o.recompute_tokens_per_s = 1e6;
  LevelPlanner p(chunks, o);
  EXPECT_EQ(p.Resolve(1, 0), 1);
  EXPECT_EQ(p.Resolve(2, 0), -1);
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_EQ(plan.decisions[0].level, 0);
  EXPECT_EQ(plan.decisions[1].level, 1);
  EXPECT_TRUE(plan.decisions[2].recompute());
  EXPECT_TRUE(plan.feasible);
}

TEST(Planner, TailTimeIsReserved) {
  LevelPlanner p(Chunks(8), Opts(0.85, 1e7));  // 8 MB at level 0 = 0.8 s
  EXPECT_EQ(p.Replan(0, 0, 0).decisions[7].level, 0);
  p.OnProcessed(0.1);  // 0.75 s left for bytes: level 0 for only some
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  EXPECT_EQ(plan.decisions[7].level, 1);
}

}  // namespace
}  // namespace cachegen
