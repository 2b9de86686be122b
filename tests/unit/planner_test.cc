// LevelPlanner: level choice against deadlines, upgrades, recompute fallback.
#include "stream/planner.h"
#include "stream/link_clock.h"

#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_TRUE(plan.hedge.empty());
}

TEST(Planner, UnknownBandwidthStillPlansTheDecoder) {
  // The link's rate is unknown, the decoder's time is not: 4 chunks decode
  // in 25.6 ms each at level 0 and 20.5 ms at level 3. 90 ms do not hold
  // 4 level-0 decodes, so the probe is not at level 0 whatever the link.
  PlannerOptions o = Opts(0.09);
  o.decode_s_per_token = 1e-4;
  o.level_decode_s_per_token = {1e-4, 0.95e-4, 0.9e-4, 0.8e-4};
  const Plan tight = LevelPlanner(Chunks(4), o).Replan(0, 0, 0);
  EXPECT_EQ(tight.decisions[0].level, 2);
  o.deadline_s = 0.11;
  for (auto d : LevelPlanner(Chunks(4), o).Replan(0, 0, 0).decisions) EXPECT_EQ(d.level, 0);
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

TEST(Planner, DecodeTimesPerLevelOnceTrustedAndNearestForOthers) {
  LevelPlanner p(Chunks(4), Opts(1.0, 1e9));
  EXPECT_EQ(p.DecodeSeconds(0, 0), 0) << "unknown before any chunk was processed";
  p.OnProcessed(0.010, 0);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 0), 0.010);
  // Level 3 not seen: level 0's time (a coarse level decodes about as fast).
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 0.010);
  // One fast level-3 decode is noise, not a faster level: every level takes
  // the time smoothed over all of them (0.5 * 0.010 + 0.5 * 0.006).
  p.OnProcessed(0.006, 3);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 0.008);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 0), 0.008);
  // Seen 3 times, level 3 has its own time; the others take the nearest
  // trusted level's, finer first.
  p.OnProcessed(0.006, 3);
  p.OnProcessed(0.006, 3);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 0.006);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 1), 0.006);
  p.OnProcessed(0.010, 0);
  p.OnProcessed(0.010, 0);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 0), 0.010);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 1), 0.010) << "nearest trusted level, finer first";
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 2), 0.006);
}

TEST(Planner, DecodeBoundTransfersPickFasterDecodingLevels) {
  // A fast link (4 MB in 4 ms) but 100 ms of decode per level-0 chunk and
  // 50 ms per level-3 chunk (level 1 takes level 0's, level 2 level 3's):
  // with 0.21 s left only levels 2 and 3 fit 4 chunks; level 2 is finer.
  LevelPlanner p(Chunks(4), Opts(0.21, 1e9));
  EXPECT_EQ(p.Replan(0, 0, 0).decisions[0].level, 0) << "no decode times known yet";
  for (int i = 0; i < 3; ++i) {
    p.OnProcessed(0.100, 0);
    p.OnProcessed(0.050, 3);
  }
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 2);
  // Decode already ahead (pending) counts too: nothing fits then.
  EXPECT_FALSE(p.Replan(0, 0, 0, 0.2).feasible);
}

TEST(Planner, LateDecodeBoundPlanKeepsLevelsThatAreNoSlower) {
  // Decode-bound and late whatever the level: every level decodes in 100 ms
  // per chunk, the link is fast. Coarser chunks would end no sooner, so the
  // late plan stays at the finest level instead of the coarsest.
  LevelPlanner p(Chunks(4), Opts(0.2, 1e9));
  p.OnProcessed(0.100, 0);
  p.OnProcessed(0.100, 3);
  Plan plan = p.Replan(0, 0, 0);
  EXPECT_FALSE(plan.feasible);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 0);
  // Transfer-bound and late: coarsest (it ends sooner).
  LevelPlanner slow(Chunks(4), Opts(0.2, 1e6));
  for (auto d : slow.Replan(0, 0, 0).decisions) EXPECT_EQ(d.level, 3);
}

TEST(Planner, DecodeTimePriorPerTokenUntilAChunkIsProcessed) {
  PlannerOptions o = Opts(1.0, 1e9);
  o.decode_s_per_token = 1e-5;
  std::vector<PlanChunk> chunks = Chunks(2);
  chunks[1].tokens = 100;
  LevelPlanner p(chunks, o);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(0, 0), 256 * 1e-5);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 100 * 1e-5);
  p.OnProcessed(0.004, 0);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 3), 0.004) << "measured replaces the prior";
}

TEST(Planner, PerLevelDecodePriorScaledToThisFetchsSpeed) {
  PlannerOptions o = Opts(1.0, 1e9);
  o.decode_s_per_token = 1e-5;
  o.level_decode_s_per_token = {1e-5, 0, 0, 0.8e-5};  // levels 1, 2 not measured
  LevelPlanner p(Chunks(4), o);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(0, 3), 256 * 0.8e-5) << "the prior before any chunk";
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(0, 1), 256 * 1e-5) << "no prior for the level: decode_s_per_token";
  // This fetch's first decode ran twice as slow as the prior's (2 x 256 x
  // 1e-5 = 5.12 ms a level-0 chunk): the speed is the mean of that and the
  // prior counted as 3 decodes (1.25), and level 3 keeps its ratio to
  // level 0.
  p.OnProcessed(0.00512, 0, 256);
  EXPECT_NEAR(p.DecodeSeconds(1, 3), 1.25 * 256 * 0.8e-5, 1e-12);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 1), 0.00512) << "no prior: the time seen";
  // A level with a prior keeps it, scaled by every decode's speed, however
  // often it was seen: 3 decodes at level 3, each 0.003 / 0.002048 times
  // the prior.
  double speed = 1.25;
  for (int seen = 2; seen <= 4; ++seen) {
    p.OnProcessed(0.003, 3, 256);
    speed += (0.003 / (256 * 0.8e-5) - speed) / (seen + 3);
  }
  EXPECT_NEAR(p.DecodeSeconds(1, 3), speed * 256 * 0.8e-5, 1e-12);
  // Chunks of other sizes scale by their tokens; a chunk processed without
  // its tokens does not move the speed.
  const double before = p.DecodeSeconds(1, 0);
  p.OnProcessed(1.0, 0);
  EXPECT_NE(p.DecodeSeconds(1, 0), 1.0);
  EXPECT_DOUBLE_EQ(p.DecodeSeconds(1, 0), before);
}

TEST(Planner, PerLevelDecodePriorMakesADecodeBoundDeadlineFeasible) {
  // 4 chunks, a fast link; per chunk, level 0 decodes in 256 x 1e-4 = 25.6
  // ms, level 2 in 23.0 ms, level 3 in 20.5 ms. 90 ms fit 4 chunks at level
  // 3, and then three of them one level finer (2.6 ms more each); 110 ms fit
  // level 0. Without the prior every level decodes alike: infeasible.
  auto plan_for = [](double deadline_s, bool prior) {
    PlannerOptions o = Opts(deadline_s, 1e9);
    o.decode_s_per_token = 1e-4;
    if (prior) o.level_decode_s_per_token = {1e-4, 0.95e-4, 0.9e-4, 0.8e-4};
    return LevelPlanner(Chunks(4), o).Replan(0, 0, 0);
  };
  EXPECT_FALSE(plan_for(0.09, false).feasible);
  const Plan tight = plan_for(0.09, true);
  ASSERT_TRUE(tight.feasible);
  const std::vector<int> want = {2, 2, 2, 3};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(tight.decisions[i].level, want[i]) << i;
  for (auto d : plan_for(0.11, true).decisions) EXPECT_EQ(d.level, 0);
}

TEST(Planner, ReceiveCostFromDecodesDuringWhichBytesArrived) {
  constexpr uint64_t kMiB = 1 << 20;
  PlannerOptions o = Opts(1.0, 1e9);
  o.receive_cost_s_per_byte = 2e-9;
  LevelPlanner p(Chunks(4), o);
  EXPECT_FALSE(p.receive_cost_measured());
  EXPECT_DOUBLE_EQ(p.ReceiveCost(), 2e-9) << "the prior until measured";
  p.OnDecoderLoss(0.005, 0.003, 2 * kMiB);  // 2 ms lost while 2 MiB arrived
  p.OnDecoderLoss(0.004, 0.004, 0);         // nothing arrived: not counted
  p.OnDecoderLoss(0.009, 0.003, 0);         // lost to other work: not counted
  p.OnDecoderLoss(0.003, 0.004, kMiB);      // more CPU than wall: malformed
  p.OnDecoderLoss(0.004, 0.003, kMiB);
  EXPECT_FALSE(p.receive_cost_measured()) << "2 samples";
  p.OnDecoderLoss(0.003, 0.003, kMiB);
  ASSERT_TRUE(p.receive_cost_measured());
  EXPECT_DOUBLE_EQ(p.ReceiveCost(), 0.003 / (4.0 * kMiB));

  // A slow link: a few KB per decode, and any time lost to other work would
  // read as a large cost per byte. Not measured until 4 MiB arrived.
  LevelPlanner slow(Chunks(4), o);
  for (int i = 0; i < 10; ++i) slow.OnDecoderLoss(0.004, 0.003, 44 << 10);
  EXPECT_FALSE(slow.receive_cost_measured());
  EXPECT_DOUBLE_EQ(slow.ReceiveCost(), 2e-9);
}

TEST(Planner, ReceiveCostMakesDecodeBoundPlansCoarser) {
  // 16 chunks of 1 MB at level 0 (0.75 MB at 1, ...), a 500 MB/s link
  // (32 ms for level 0) and 3 ms of decode per chunk (48 ms): decode-bound.
  // With 61.9 ms, level 0 fits as long as receiving costs the decoder
  // nothing; losing 1 ms per MB received, level 0 needs 48 + 16 ms and
  // level 1 48 + 12, and the 1.9 ms left upgrade 7 chunks (0.25 ms each).
  auto planner = [](double receive_cost) {
    PlannerOptions o = Opts(0.0619, 500e6);
    o.receive_cost_s_per_byte = receive_cost;
    LevelPlanner p(Chunks(16), o);
    for (int i = 0; i < 3; ++i) p.OnProcessed(0.003, 0);
    return p;
  };
  Plan free = planner(0).Replan(0, 0, 0);
  EXPECT_TRUE(free.feasible);
  for (auto d : free.decisions) EXPECT_EQ(d.level, 0);
  Plan costly = planner(1e-9).Replan(0, 0, 0);
  EXPECT_TRUE(costly.feasible);
  for (uint32_t c = 0; c < 16; ++c)
    EXPECT_EQ(costly.decisions[c].level, c < 7 ? 0 : 1) << "chunk " << c << ": upgraded earliest first";
  // A slow link: the bytes' link time dwarfs what they cost the decoder.
  PlannerOptions slow = Opts(0.2, 100e6);
  slow.receive_cost_s_per_byte = 1e-9;
  LevelPlanner q(Chunks(16), slow);
  for (int i = 0; i < 3; ++i) q.OnProcessed(0.003, 0);
  Plan by_link = q.Replan(0, 0, 0);
  LevelPlanner r(Chunks(16), Opts(0.2, 100e6));
  for (int i = 0; i < 3; ++i) r.OnProcessed(0.003, 0);
  Plan by_link_free = r.Replan(0, 0, 0);
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(by_link.decisions[c].level, by_link_free.decisions[c].level);
}

TEST(Planner, InFlightRequestsKeptWhileTheDeadlineAllows) {
  // 8 chunks at 10 MB/s, 1 s: level 0 (0.8 s) fits; the two requests in
  // flight at level 0 are kept.
  LevelPlanner p(Chunks(8), Opts(1.0, 1e7));
  const std::vector<InFlight> flight = {{0, 0, 500000}, {1, 0, 0}};
  Plan plan = p.Replan(2, 0, flight);
  EXPECT_TRUE(plan.feasible);
  ASSERT_EQ(plan.reissue.size(), 2u);
  EXPECT_EQ(plan.reissue[0], -1);
  EXPECT_EQ(plan.reissue[1], -1);
  ASSERT_EQ(plan.decisions.size(), 6u);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 0);
}

TEST(Planner, RateDropReissuesInFlightRequestsCoarser) {
  // Requested at level 0 for a fast link; the link fell to 1 MB/s with 1.9 s
  // left for 4 chunks. Keeping both level-0 requests (0.5 + 1 MB still to
  // come) and level 3 for the rest takes 2.34 s: late. Re-requesting chunk 1
  // at level 3 (0.42 MB) fits (1.77 s); chunk 0 has too little left to gain
  // (0.42 MB at level 3 is not 10 % less than its 0.5 MB) and is kept.
  LevelPlanner p(Chunks(4), Opts(2.0, 1e6));
  const std::vector<InFlight> flight = {{0, 0, 500000}, {1, 0, 0}};
  Plan plan = p.Replan(2, 0.1, flight);
  EXPECT_TRUE(plan.feasible);
  ASSERT_EQ(plan.reissue.size(), 2u);
  EXPECT_EQ(plan.reissue[0], -1);
  EXPECT_EQ(plan.reissue[1], 3);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 3);
  EXPECT_NEAR(plan.expected_s, 0.5 + 3 * 0.421875, 1e-6);
}

TEST(Planner, ReissueOnlyToCoarserAndCheaperLevels) {
  // A request in flight at level 2 that the plan would upgrade to level 0
  // is never re-issued finer; one at level 3 is never re-issued at all.
  LevelPlanner p(Chunks(4), Opts(10.0, 1e7));
  const std::vector<InFlight> flight = {{0, 2, 0}, {1, 3, 0}};
  Plan plan = p.Replan(2, 0, flight);
  EXPECT_TRUE(plan.feasible);
  EXPECT_EQ(plan.reissue[0], -1);
  EXPECT_EQ(plan.reissue[1], -1);
  EXPECT_EQ(plan.decisions[0].level, 0);
  // Slack for some upgrades only: a re-issued chunk may come back one level
  // finer than the uniform level, but not finer than its request in flight
  // would give for free... (here: tight, 1 MB/s, chunk 0 at level 0 with
  // nothing received is re-issued at level 2 or 3, never kept at 0).
  LevelPlanner tight(Chunks(4), Opts(2.0, 1e6));
  const std::vector<InFlight> f0 = {{0, 0, 0}};
  Plan t = tight.Replan(1, 0, f0);
  EXPECT_TRUE(t.feasible);
  EXPECT_GE(t.reissue[0], 2);
}

TEST(LinkClock, LeavesTheRoundTripOutOnceMeasured) {
  LinkClock clock;
  // The first request: its 20 ms wait for a first byte is not known to be a
  // round trip yet, so all 40 ms count.
  const size_t a = clock.Issue(0);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.010), 0.010);
  clock.Finish(a, 0.040, 0.020, 100);
  EXPECT_DOUBLE_EQ(clock.latency_s(), 0.020);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.050), 0.040) << "nothing outstanding: idle";
  // The next ones count from their round trip on; overlaps count once.
  const size_t b = clock.Issue(0.050);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.060), 0.040);
  const size_t c = clock.Issue(0.075);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.080), 0.050);
  clock.Finish(b, 0.100, 0.070, 50);
  clock.Finish(c, 0.110, 0.100, 50);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.200), 0.040 + 0.040);
  // A stall after the round trip is a slower link: it stays busy.
  const size_t d = clock.Issue(0.200);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.300), 0.080 + 0.080);
  clock.Finish(d, 0.300, 0.290, 10);
  EXPECT_DOUBLE_EQ(clock.latency_s(), 0.020) << "the least wait";
}

TEST(LinkClock, OnePieceTellsNoRoundTrip) {
  LinkClock clock;
  // A store that reports no progress, or a frame in one piece: the wait
  // cannot be told from the transfer, and the latency stays unknown (0).
  clock.Finish(clock.Issue(0), 0.030, 0.030, 1);
  clock.Finish(clock.Issue(0.030), 0.060, -1, 0);
  EXPECT_DOUBLE_EQ(clock.latency_s(), 0);
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.060), 0.060);
  clock.Finish(9, 1.0, 0.5, 3);  // no such request: ignored
  EXPECT_DOUBLE_EQ(clock.BusySeconds(0.060), 0.060);
}

TEST(RateEstimator, SteadyRateFromTheLongWindow) {
  RateEstimator r;  // 1 MB / 20 ms long window, 256 KB / 15 ms short window
  EXPECT_EQ(r.rate(), 0);
  // 10 MB/s in bursts of 64 KB every 6.5536 ms.
  const double burst_s = 65536.0 / 1e7;
  for (int i = 1; i <= 40; ++i) r.Observe(i * burst_s, 65536ull * i);
  EXPECT_NEAR(r.rate(), 1e7, 1e3);
  EXPECT_EQ(r.drops(), 0);
}

TEST(RateEstimator, TicksBetweenBurstsBiasNeitherWay) {
  // The client observes at 2 ms ticks between arrivals too, so a shaped
  // link's bursts leave plateaus: points with the same total. 12.5 MB/s
  // (0.1 Gbit/s) in bursts of 64 KB every 5.24 ms. A window from a
  // plateau's last point counts one burst more than the time it spans
  // (+6.7 % for 16 bursts), and one to the newest tick one interval more
  // than its bytes: neither may show, in the long window or the short one.
  for (const bool short_only : {false, true}) {
    RateEstimator::Options o;
    if (short_only) o.long_bytes = 1ull << 40;  // the long window never fills
    RateEstimator r(o);
    const double burst_s = 65536.0 / 1.25e7;
    uint64_t total = 0;
    for (int i = 1; i <= 200; ++i) {
      const double arrival = i * burst_s;
      total += 65536;
      r.Observe(arrival, total);
      for (double t = arrival; t < arrival + burst_s; t += 0.002) {
        r.Observe(t, total);
        if (i >= 20) {
          ASSERT_NEAR(r.rate(), 1.25e7, 1.25e5) << "burst " << i << ", short only " << short_only;
        }
      }
    }
    EXPECT_EQ(r.drops(), 0);
  }
}

TEST(RateEstimator, FirstEstimateFromTheShortWindow) {
  RateEstimator r;  // the windows begin at the origin (0, 0)
  r.Observe(0.004, 200000);
  EXPECT_EQ(r.rate(), 0) << "under 256 KB";
  r.Observe(0.010, 500000);
  EXPECT_EQ(r.rate(), 0) << "under 15 ms";
  r.Observe(0.016, 800000);
  EXPECT_NEAR(r.rate(), 5e7, 1);
}

TEST(RateEstimator, AFinishedProbeGivesTheFirstEstimate) {
  // 1 Gbit/s in 64 KB bursts: a 1 MB frame arrives in 8.4 ms, under the
  // short window's 15 ms floor.
  RateEstimator r;
  const double burst_s = 65536.0 / 1.25e8;
  for (int i = 1; i <= 16; ++i) r.Observe(i * burst_s, 65536ull * i);
  EXPECT_EQ(r.rate(), 0) << "no window has filled";
  r.ObserveCompletion(16 * burst_s, 65536ull * 16);
  EXPECT_NEAR(r.rate(), 1.25e8, 1e5);
  // Once windows fill, they answer; a later completion changes nothing.
  for (int i = 17; i <= 80; ++i) r.Observe(i * burst_s * 2, 65536ull * i);  // a pause, then half the rate
  const double windowed = r.rate();
  EXPECT_LT(windowed, 1e8);
  r.ObserveCompletion(80 * burst_s * 2, 65536ull * 80);
  EXPECT_EQ(r.rate(), windowed);

  // A frame that arrives within 5 ms (loopback at 10 Gbit/s) measures the
  // threads more than the link: no estimate from it.
  RateEstimator fast;
  fast.ObserveCompletion(0.0004, 1 << 20);
  EXPECT_EQ(fast.rate(), 0);
}

TEST(RateEstimator, TheFirstLookCountsFromTheOrigin) {
  // The client's first look comes after its first request went out (busy
  // time 0): a tick later, or once a whole frame is in. What arrived before
  // the look counts, over the time since the origin.
  RateEstimator whole_frame;  // a 1 MB frame at 1 Gbit/s, seen only once it is in
  whole_frame.ObserveCompletion(0.0084, 1 << 20);
  EXPECT_NEAR(whole_frame.rate(), (1 << 20) / 0.0084, 1);

  RateEstimator late_look;  // first look at 16 ms, 800 KB in: the short window spans them
  late_look.Observe(0.016, 800000);
  EXPECT_NEAR(late_look.rate(), 5e7, 1);
  EXPECT_FALSE(late_look.settled()) << "one short window since the origin, not two";
  late_look.Observe(0.032, 1600000);
  EXPECT_NEAR(late_look.rate(), 5e7, 1);
  EXPECT_TRUE(late_look.settled());

  // Observations that go back in time or bytes are ignored, the origin's too.
  RateEstimator r;
  r.Observe(-1, 0);
  r.Observe(0.020, 1000000);
  EXPECT_NEAR(r.rate(), 5e7, 1);
}

TEST(RateEstimator, DropTakenAtOnceAndSilenceCounts) {
  RateEstimator r;
  uint64_t total = 0;
  double t = 0;
  for (int i = 0; i < 100; ++i, t += 0.001, total += 125000) r.Observe(t, total);  // 125 MB/s
  EXPECT_NEAR(r.rate(), 1.25e8, 1e6);
  // The rate falls tenfold: within a short window (15 ms) the estimate follows.
  for (int i = 0; i < 15; ++i, t += 0.001, total += 12500) r.Observe(t, total);
  EXPECT_EQ(r.drops(), 1);
  EXPECT_LT(r.rate(), 0.5 * 1.25e8);
  for (int i = 0; i < 100; ++i, t += 0.001, total += 12500) r.Observe(t, total);
  EXPECT_NEAR(r.rate(), 1.25e7, 1e5);
  // Nothing arrives for 50 ms while requests are out: that is a drop too.
  for (int i = 0; i < 50; ++i, t += 0.001) r.Observe(t, total);
  EXPECT_EQ(r.drops(), 2);
  EXPECT_LT(r.rate(), 0.5 * 1.25e7);
}

TEST(RateEstimator, ShortStallOnAFastLinkIsNoDrop) {
  // 1 GB/s with one 5 ms stall (the reading thread descheduled on a loaded
  // machine): the short window spans at least 15 ms, so the stall costs a
  // third of it, not a drop.
  RateEstimator r;
  uint64_t total = 0;
  double t = 0;
  for (int i = 0; i < 100; ++i, t += 0.0005, total += 500000) r.Observe(t, total);
  t += 0.005;
  r.Observe(t, total);
  for (int i = 0; i < 4; ++i, t += 0.0005, total += 500000) r.Observe(t, total);
  EXPECT_EQ(r.drops(), 0);
  EXPECT_GT(r.rate(), 0.6e9);
}

TEST(RateEstimator, SettledOneShortWindowAfterTheRegimeBegan) {
  RateEstimator r;  // short window 256 KB / 15 ms
  EXPECT_FALSE(r.settled()) << "no estimate";
  uint64_t total = 0;
  double t = 0;
  for (int i = 0; i <= 20; ++i, t += 0.001, total += 125000) r.Observe(t, total);  // 125 MB/s, 20 ms
  EXPECT_GT(r.rate(), 0);
  EXPECT_FALSE(r.settled()) << "one short window since the first observation";
  for (int i = 0; i < 20; ++i, t += 0.001, total += 125000) r.Observe(t, total);
  EXPECT_TRUE(r.settled());
  // Nothing arrives for 20 ms: a drop, taken at once but not settled...
  for (int i = 0; i < 20; ++i, t += 0.001) r.Observe(t, total);
  ASSERT_EQ(r.drops(), 1);
  EXPECT_FALSE(r.settled());
  // ...and a stall that ends is over before it settles: the rate is back.
  for (int i = 0; i < 10; ++i, t += 0.001, total += 250000) r.Observe(t, total);
  EXPECT_GT(r.rate(), 0.5 * 1.25e8);
  // A lasting drop (12.5 MB/s) settles one short window after its window.
  for (int i = 0; i < 100; ++i, t += 0.001, total += 12500) r.Observe(t, total);
  EXPECT_NEAR(r.rate(), 1.25e7, 2e6);
  EXPECT_TRUE(r.settled());
}

TEST(RateEstimator, SpreadOfASteadyLinkIsZeroAndOfAVaryingOneIsNot) {
  RateEstimator steady;  // segments of >= 1 MB and >= 20 ms
  EXPECT_EQ(steady.spread().segments, 0);
  // A token bucket: 64 KB bursts at exactly 10 MB/s.
  const double burst_s = 65536.0 / 1e7;
  for (int i = 0; i <= 160; ++i) steady.Observe(i * burst_s, 65536ull * i);
  const LinkSpread s = steady.spread();
  EXPECT_GE(s.segments, 9);  // 10.5 MB in segments of 16 bursts
  EXPECT_LT(s.rate_cv, 1e-9);
  EXPECT_LT(s.time_sd_s, 1e-9);

  // 8 and 12 MB/s in turns of 50 ms (no drop: the slow phase is above half
  // the estimate), segments of >= 100 KB and >= 10 ms (short window 30 KB
  // and 5 ms).
  RateEstimator::Options o;
  o.long_bytes = 100000;
  o.long_s = 0.01;
  o.short_bytes = 30000;
  o.short_s = 0.005;
  RateEstimator varying(o);
  uint64_t total = 0;
  double t = 0;
  for (int i = 0; i < 400; ++i, t += 0.001) {
    varying.Observe(t, total);
    total += (i / 50) % 2 ? 12000 : 8000;
  }
  EXPECT_EQ(varying.drops(), 0);
  const LinkSpread v = varying.spread();
  EXPECT_GE(v.segments, 20);
  EXPECT_GT(v.rate_cv, 0.1);
  EXPECT_LT(v.rate_cv, 0.3);
  EXPECT_GT(v.time_sd_s, 0.001);

  // A drop starts a new regime: its spread is measured afresh.
  for (int i = 0; i < 20; ++i, t += 0.001, total += 3000) varying.Observe(t, total);
  ASSERT_EQ(varying.drops(), 1);
  EXPECT_LT(varying.spread().segments, 3);
}

// 16 chunks of 1 MB at level 0, 10 MB/s: level 0 takes 1.6 s, and the
// deadline, 1.65 s, leaves 3 % (the row a fixed level-0 client meets).
LevelPlanner TightPlanner() {
  PlannerOptions o;  // default margins: 0.9 of the estimate, 5 % reserve
  o.deadline_s = 1.65;
  o.initial_bandwidth_bytes_s = 1e7;
  return LevelPlanner(Chunks(16), o);
}

bool AllFinest(const Plan& plan) {
  for (auto d : plan.decisions)
    if (d.level != 0) return false;
  return true;
}

TEST(Planner, MeasuredSteadyLinkNarrowsTheMargins) {
  LevelPlanner p = TightPlanner();
  for (int i = 0; i < 4; ++i) p.OnProcessed(0.010, 0);  // decode: 10 ms, no spread
  // Link spread unknown: the configured margins, and level 0 does not fit.
  PlanMargins m = p.Margins();
  EXPECT_DOUBLE_EQ(m.link_safety, 0.9);
  EXPECT_DOUBLE_EQ(m.decode_safety, 0.99);
  EXPECT_DOUBLE_EQ(m.reserve_s, 0.05 * 1.65);
  EXPECT_FALSE(AllFinest(p.Replan(0, 0, 0)));
  p.SetLinkSpread({2, 0.002, 0.001});
  EXPECT_DOUBLE_EQ(p.Margins().link_safety, 0.9) << "two segments are not a spread";
  // A steady link (cv 0.2 %, 1 ms of timing noise): derating 0.99 (the cap,
  // 1 - 2 * 0.002 is above it), reserve 2 ms + 0.5 % of the deadline.
  p.SetLinkSpread({5, 0.002, 0.001});
  m = p.Margins();
  EXPECT_DOUBLE_EQ(m.link_safety, 0.99);
  EXPECT_NEAR(m.reserve_s, 0.002 + 0.005 * 1.65, 1e-12);
  // 1.6 s / 0.99 + 10 ms of tail = 1.626 s <= 1.65 - 10.25 ms.
  const Plan plan = p.Replan(0, 0, 0);
  EXPECT_TRUE(plan.feasible);
  EXPECT_TRUE(AllFinest(plan));
}

TEST(Planner, MeasuredNoiseNeverWidensBeyondTheConfiguredMargins) {
  LevelPlanner p = TightPlanner();
  // Decode times 10, 20, 10, 20 ms: residuals against the level's estimate
  // 10, -5, 7.5 ms (sd 7.8 ms, 48 % of the 16 ms estimate).
  for (double s : {0.010, 0.020, 0.010, 0.020}) p.OnProcessed(s, 0);
  p.SetLinkSpread({5, 0.2, 0.05});  // a noisy link
  const PlanMargins m = p.Margins();
  EXPECT_DOUBLE_EQ(m.link_safety, 0.9);
  EXPECT_DOUBLE_EQ(m.decode_safety, 0.9);
  EXPECT_DOUBLE_EQ(m.reserve_s, 0.05 * 1.65);
  EXPECT_FALSE(AllFinest(p.Replan(0, 0, 0)));
  // A steady link with that decoder: the reserve covers the decode spread
  // (2 sd, about 16 ms) and stays under the configured 82.5 ms.
  p.SetLinkSpread({5, 0.002, 0.001});
  const double decode_sd = std::sqrt((1e-4 + 2.5e-5 + 5.625e-5) / 3);
  EXPECT_NEAR(p.Margins().reserve_s, 2 * std::sqrt(1e-6 + decode_sd * decode_sd) + 0.005 * 1.65, 1e-9);
  EXPECT_DOUBLE_EQ(p.Margins().decode_safety, 0.9);
}

TEST(Planner, DecodeSpreadFromEarlierFetchesSetsTheMarginsFromTheStart) {
  PlannerOptions o;
  o.deadline_s = 1.0;
  o.initial_bandwidth_bytes_s = 1e9;
  o.decode_s_per_token = 1e-5;  // 2.56 ms a chunk
  o.decode_cv = 0.1;            // an earlier fetch's
  const LevelPlanner p(Chunks(16), o);
  // 16 decodes ahead: their sum spreads a quarter of one decode's 10 %
  // (a plan derates by half of that margin, the escape by all of it).
  EXPECT_NEAR(p.Margins(16).decode_safety, 1 - 2 * 0.1 / 4, 1e-12);
  EXPECT_NEAR(p.Margins(16).decodes_sd_s, 0.1 * 0.00256 * 4, 1e-15);
  EXPECT_DOUBLE_EQ(p.Margins(1).decode_safety, 0.9) << "never below safety";
  // The link's spread is unknown: the configured reserve, unless the fetch
  // is decode-bound, where the decoder's spread sizes it.
  EXPECT_DOUBLE_EQ(p.Margins(16).reserve_s, 0.05);
  EXPECT_NEAR(p.Margins(16, true).reserve_s, 2 * 0.1 * 0.00256 + 0.005, 1e-12);
  // A 16 MB context at 1 GB/s takes 16 ms of link against 41 ms of decode:
  // decode-bound, so level 0 fits 45 ms (41 / 0.975 + 0.7 ms of reserve;
  // the escape: 41 + 2 x 1 ms of the decodes' spread).
  LevelPlanner q(Chunks(16), [&] {
    PlannerOptions x = o;
    x.deadline_s = 0.045;
    return x;
  }());
  const Plan fits = q.Replan(0, 0, 0);
  EXPECT_TRUE(fits.feasible);
  EXPECT_TRUE(AllFinest(fits));
  // Without the earlier fetch's spread, the configured margins (41 / 0.9 +
  // 2.25 ms): nothing fits (coarser levels decode no faster here).
  LevelPlanner r(Chunks(16), [&] {
    PlannerOptions x = o;
    x.deadline_s = 0.045;
    x.decode_cv = 0;
    return x;
  }());
  EXPECT_FALSE(r.Replan(0, 0, 0).feasible);
}

TEST(Planner, EscapeKeepsTheTailRecoverable) {
  // 4 chunks; level 0 decodes in 25.6 ms, level 3 in 20.5 ms; a fast link.
  // 105 ms hold 4 level-0 decodes (102.4 ms), and the plan takes level 0.
  // With a decode spread of 20 % the sum of 4 decodes spreads 10.2 ms: the
  // chunk requested now must leave the 3 others room at level 3 and 2 of
  // those standard deviations (61.4 + 20.5 ms), so it is requested at
  // level 2 (23.0 ms); the later ones are still planned at level 0.
  PlannerOptions o = Opts(0.105, 1e9);
  o.decode_s_per_token = 1e-4;
  o.level_decode_s_per_token = {1e-4, 0.95e-4, 0.9e-4, 0.8e-4};
  const Plan sure = LevelPlanner(Chunks(4), o).Replan(0, 0, 0);
  for (auto d : sure.decisions) EXPECT_EQ(d.level, 0);
  o.decode_cv = 0.2;
  const Plan spread = LevelPlanner(Chunks(4), o).Replan(0, 0, 0);
  EXPECT_EQ(spread.decisions[0].level, 2);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(spread.decisions[i].level, 0) << i;
}

TEST(Planner, HedgesTheLatestChunksFromSpareSlackOnly) {
  // 8 chunks, 10 MB/s: level 0 takes 0.8 s. Deadline 1.2 s: 0.4 s spare. A
  // fall to 1 MB/s now would leave 3.4 s of coarsest frames: exposed. A
  // backup (the coarsest frame, 42 ms of link) is named while the spare is
  // at least 3 x its time + 2 x the backups' before it: chunks 7, 6 and 5
  // (127 ms, within a third of the spare), latest first. Levels are not
  // touched.
  LevelPlanner p(Chunks(8), Opts(1.2, 1e7));
  const Plan plan = p.Replan(0, 0, 0);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(AllFinest(plan));
  EXPECT_EQ(plan.hedge, (std::vector<uint32_t>{7, 6, 5}));
  // With those out (nothing arrived yet), the next plan names no more: all
  // backups stay within a third of the spare they came from.
  const std::vector<InFlight> backups = {{7, 3, 0}, {6, 3, 0}, {5, 3, 0}};
  const Plan next = p.Replan(0, 0, {}, backups, 0);
  EXPECT_TRUE(next.feasible);
  EXPECT_TRUE(AllFinest(next)) << "a backup is not the plan's level while the finer frame fits";
  EXPECT_TRUE(next.hedge.empty());
  // A plan without spare names none; a loose one names every chunk.
  EXPECT_TRUE(LevelPlanner(Chunks(8), Opts(0.82, 1e7)).Replan(0, 0, 0).hedge.empty());
  EXPECT_EQ(LevelPlanner(Chunks(8), Opts(2.0, 1e7)).Replan(0, 0, 0).hedge.size(), 8u);
  // A chunk planned at its coarsest level gets no backup (it would be the
  // same frame): 8 chunks at level 3 (3.4 MB) in a 0.36 s plan at 10 MB/s.
  EXPECT_TRUE(LevelPlanner(Chunks(8), Opts(0.36, 1e7)).Replan(0, 0, 0).hedge.empty());
  // Not exposed: with 5 s, even a fall to 1 MB/s leaves time for the
  // coarsest frames (3.4 s), so the slack buys nothing.
  EXPECT_TRUE(LevelPlanner(Chunks(8), Opts(5.0, 1e7)).Replan(0, 0, 0).hedge.empty());
  // Exposed to a fall to a third (1.17 s: the coarsest frames and the 512
  // KiB the fallen link carries before the client reacts) with 1.2 s only
  // when the insured fall is deeper than that, or the reaction slower.
  PlannerOptions o = Opts(1.2, 1e7);
  o.hedge_drop = 3;
  EXPECT_TRUE(LevelPlanner(Chunks(8), o).Replan(0, 0, 0).hedge.empty());
  o.hedge_react_bytes = 1u << 20;  // 1.33 s
  EXPECT_FALSE(LevelPlanner(Chunks(8), o).Replan(0, 0, 0).hedge.empty());
  o.hedge_react_bytes = PlannerOptions().hedge_react_bytes;
  o.hedge_drop = 4;
  EXPECT_FALSE(LevelPlanner(Chunks(8), o).Replan(0, 0, 0).hedge.empty());
  o.hedge = false;
  EXPECT_TRUE(LevelPlanner(Chunks(8), o).Replan(0, 0, 0).hedge.empty());
  // Decode-bound (130 ms per chunk: 1.04 s of decode against 0.93 s of
  // transfer and the last decode): no backups, though exposed and with
  // spare time on both stages (0.16 s on the decoder's).
  LevelPlanner slow_decoder(Chunks(8), Opts(1.2, 1e7));
  for (int i = 0; i < 4; ++i) slow_decoder.OnProcessed(0.130, 0);
  const Plan bound = slow_decoder.Replan(0, 0, 0);
  EXPECT_TRUE(bound.feasible);
  EXPECT_TRUE(bound.hedge.empty());
  LevelPlanner fast_decoder(Chunks(8), Opts(1.2, 1e7));
  for (int i = 0; i < 4; ++i) fast_decoder.OnProcessed(0.010, 0);
  EXPECT_FALSE(fast_decoder.Replan(0, 0, 0).hedge.empty());
}

TEST(Planner, BackupsStandInWhenTheRateFalls) {
  // 8 chunks, deadline 1 s; chunks 0-4 are done at 0.5 s when the link falls
  // to 1 MB/s: 0.5 MB of transfer left. Without backups the three chunks
  // left need 1.27 MB at the coarsest level: late. With the backups of
  // chunks 6 and 7 arrived, chunk 5 at level 3 (0.42 MB) fits and 6 and 7
  // are delivered from their backups.
  LevelPlanner p(Chunks(8), Opts(1.0, 1e6));
  EXPECT_FALSE(p.Replan(5, 0.5, 0).feasible);
  const std::vector<InFlight> backups = {{6, 3, 421875}, {7, 3, 421875}};
  const Plan plan = p.Replan(5, 0.5, {}, backups, 0);
  EXPECT_TRUE(plan.feasible);
  ASSERT_EQ(plan.decisions.size(), 3u);
  for (auto d : plan.decisions) EXPECT_EQ(d.level, 3);
  EXPECT_NEAR(plan.expected_s, 0.421875, 1e-9);
  // The backups' bytes still to come count: with both just requested the
  // same plan is late.
  const std::vector<InFlight> requested = {{6, 3, 0}, {7, 3, 0}};
  EXPECT_FALSE(p.Replan(5, 0.5, {}, requested, 0).feasible);

  // A request in flight at level 0 (1 MB to come) for a chunk whose backup
  // has arrived: it is abandoned for the backup (Plan::reissue at the
  // backup's level), not re-issued at a level that costs more link time.
  const std::vector<InFlight> flight = {{6, 0, 0}};
  const Plan drop = p.Replan(7, 0.5, flight, backups, 0);
  EXPECT_TRUE(drop.feasible);
  ASSERT_EQ(drop.reissue.size(), 1u);
  EXPECT_EQ(drop.reissue[0], 3);
  EXPECT_EQ(drop.decisions[0].level, 3);
  // With time for it, the request is kept and the backup goes unused.
  LevelPlanner loose(Chunks(8), Opts(3.0, 1e6));
  const Plan keep = loose.Replan(7, 0.5, flight, backups, 0);
  EXPECT_EQ(keep.reissue[0], -1);
  EXPECT_EQ(keep.decisions[0].level, 0) << "a finer frame still fits: the backup is not used";
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
