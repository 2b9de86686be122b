// The streaming simulation's link model: mahimahi traces (parsing, looping,
// time scale) and transfers sharing a link first come, first served.
#include "stream/link_trace.h"

#include <gtest/gtest.h>

#include <cmath>

#include "shared_data.h"

namespace cachegen::sim {
namespace {

TEST(LinkTrace, ParsesLoopsAndScales) {
  // Two packets at 1 ms, one at 3 ms, one at 4 ms: a 4 ms period of 4 packets.
  auto t = LinkTrace::Parse("1\n1\n3\n\n4\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->packets_per_period(), 4u);
  EXPECT_DOUBLE_EQ(t->period_s(), 0.004);
  EXPECT_DOUBLE_EQ(t->mean_bytes_per_s(), 4 * 1500 / 0.004);
  EXPECT_DOUBLE_EQ(t->TimeOfPacket(0), 0.001);
  EXPECT_DOUBLE_EQ(t->TimeOfPacket(1), 0.001);
  EXPECT_DOUBLE_EQ(t->TimeOfPacket(3), 0.004);
  EXPECT_DOUBLE_EQ(t->TimeOfPacket(4), 0.005);  // the second loop
  EXPECT_DOUBLE_EQ(t->TimeOfPacket(6), 0.007);
  EXPECT_EQ(t->FirstPacketAt(0), 0u);
  EXPECT_EQ(t->FirstPacketAt(0.001), 0u);
  EXPECT_EQ(t->FirstPacketAt(0.002), 2u);
  EXPECT_EQ(t->FirstPacketAt(0.0045), 4u);
  EXPECT_EQ(t->FirstPacketAt(0.0061), 6u);
  // Time scale 1000: the same shape, a thousand times faster.
  auto fast = LinkTrace::Parse("1\n1\n3\n4\n", 1000);
  ASSERT_TRUE(fast.ok());
  EXPECT_DOUBLE_EQ(fast->period_s(), 0.000004);
  EXPECT_DOUBLE_EQ(fast->mean_bytes_per_s(), 1000 * t->mean_bytes_per_s());
}

TEST(LinkTrace, RefusesWhatIsNotATrace) {
  for (const char* bad : {"", "\n\n", "0\n", "3\n2\n", "1\nx\n", "1.5\n", "-1\n", "1 2\n", "99999999999999999999\n"})
    EXPECT_EQ(LinkTrace::Parse(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_FALSE(LinkTrace::Parse("1\n", 0).ok());
  EXPECT_FALSE(LinkTrace::Load("/nonexistent/trace.down").ok());
}

TEST(LinkQueue, TransfersShareTheLinkInOrder) {
  const LinkTrace link = LinkTrace::Constant(1500 * 1000.0);  // a packet every ms
  LinkQueue q(&link);
  const uint32_t a = q.Send(0, 3000);  // packets at 1, 2 ms
  const uint32_t b = q.Send(0, 1);     // behind a: the 3 ms packet
  EXPECT_DOUBLE_EQ(q.NextDone(), 0.002);
  q.AdvanceTo(0.0015);
  EXPECT_EQ(q.Received(a), 1500u);
  EXPECT_FALSE(q.Done(a));
  q.AdvanceTo(0.002);
  EXPECT_EQ(q.Received(a), 3000u);
  EXPECT_DOUBLE_EQ(q.DoneAt(a), 0.002);
  EXPECT_EQ(q.Received(b), 0u);
  EXPECT_DOUBLE_EQ(q.NextDone(), 0.003);
  q.AdvanceTo(0.003);
  EXPECT_EQ(q.Received(b), 1u);
  EXPECT_DOUBLE_EQ(q.DoneAt(b), 0.003);
  EXPECT_EQ(q.NextDone(), INFINITY);
  // Sent after the link went idle: the opportunities meanwhile are lost.
  q.AdvanceTo(0.0095);
  const uint32_t c = q.Send(0.0095, 1500);
  EXPECT_DOUBLE_EQ(q.NextDone(), 0.010);
  const uint32_t empty = q.Send(0.0095, 0);
  q.AdvanceTo(0.020);
  EXPECT_DOUBLE_EQ(q.DoneAt(c), 0.010);
  EXPECT_DOUBLE_EQ(q.DoneAt(empty), 0.010);  // behind c, first come first served
  EXPECT_EQ(q.Received(empty), 0u);
}

TEST(LinkQueue, CancelledTransfersFreeTheLinkAndStartsWait) {
  const LinkTrace link = LinkTrace::Constant(1500 * 1000.0);
  LinkQueue q(&link, 0.0004);  // the trace read from 0.4 ms on: packets at 0.6, 1.6, ... ms
  const uint32_t a = q.Send(0, 15000);       // 10 packets
  const uint32_t b = q.Send(0.0025, 3000);  // may not start before 2.5 ms (a round trip)
  q.AdvanceTo(0.0017);
  EXPECT_EQ(q.Received(a), 3000u);
  q.Cancel(a);  // the rest of a is never sent: b takes the next opportunities after its start
  EXPECT_DOUBLE_EQ(q.NextDone(), 0.0036);
  q.AdvanceTo(1);
  EXPECT_FALSE(q.Done(a));
  EXPECT_EQ(q.Received(a), 3000u);
  EXPECT_DOUBLE_EQ(q.DoneAt(b), 0.0036);
  EXPECT_DOUBLE_EQ(q.ArrivalOfPackets(0.001, 3), 0.0036);
  EXPECT_DOUBLE_EQ(q.ArrivalOfPackets(0.001, 0), 0.001);
}

// The shared cellular traces, where present: their documented means.
TEST(LinkTrace, SharedTracesHaveTheirDocumentedRates) {
  const std::string path = test_data::SharedPath("data/traces/Verizon-LTE-short.down");
  if (path.empty()) GTEST_SKIP() << "no shared traces here";
  auto t = LinkTrace::Load(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->packets_per_period(), 58655u);
  EXPECT_NEAR(t->mean_bytes_per_s() * 8 / 1e6, 5.0, 0.1);
  // At S = 1000 a 1 MB frame takes about 1.6 ms of a 5 Gbit/s link.
  auto fast = LinkTrace::Load(path, 1000);
  ASSERT_TRUE(fast.ok());
  LinkQueue q(&*fast);
  const uint32_t x = q.Send(0, 1000000);
  q.AdvanceTo(1);
  EXPECT_GT(q.DoneAt(x), 0.0005);
  EXPECT_LT(q.DoneAt(x), 0.02);
}

}  // namespace
}  // namespace cachegen::sim
