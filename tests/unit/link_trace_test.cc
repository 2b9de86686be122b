// The streaming simulation's link model: mahimahi traces (parsing, looping,
// time scale) and transfers sharing a link first come, first served.
#include "stream/link_trace.h"

#include <gtest/gtest.h>

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
  const auto a = q.Send(0, 3000);  // packets at 1, 2 ms
  EXPECT_EQ(a.packets, 2u);
  EXPECT_DOUBLE_EQ(a.done_s, 0.002);
  const auto b = q.Send(0, 1);  // behind a: the 3 ms packet
  EXPECT_DOUBLE_EQ(b.done_s, 0.003);
  EXPECT_EQ(q.ReceivedBy(a, 0.0015), 1500u);
  EXPECT_EQ(q.ReceivedBy(a, 0.002), 3000u);
  EXPECT_EQ(q.ReceivedBy(b, 0.0029), 0u);
  EXPECT_EQ(q.ReceivedBy(b, 0.003), 1u);
  // Sent after the link went idle: the opportunities meanwhile are lost.
  const auto c = q.Send(0.010, 1500);
  EXPECT_DOUBLE_EQ(c.done_s, 0.010);
  const auto empty = q.Send(0.020, 0);
  EXPECT_DOUBLE_EQ(empty.done_s, 0.020);
  EXPECT_EQ(q.ReceivedBy(empty, 1), 0u);
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
  const auto x = q.Send(0, 1000000);
  EXPECT_GT(x.done_s, 0.0005);
  EXPECT_LT(x.done_s, 0.02);
}

}  // namespace
}  // namespace cachegen::sim
