#include "serve/slot_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace cachegen::serve {
namespace {

TEST(SlotPool, HandsOutEverySlotOnceThenQueuesThenRefuses) {
  SlotPool pool(2, 1);
  auto a = pool.Acquire(), b = pool.Acquire();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(pool.busy(), 2u);
  std::optional<uint32_t> waited;
  std::thread waiter([&] { waited = pool.Acquire(); });
  while (pool.waiting() == 0) std::this_thread::yield();
  EXPECT_FALSE(pool.Acquire().has_value());  // queue of 1 is full: refused at once
  pool.Release(*a);
  waiter.join();
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(*waited, *a);
}

TEST(SlotPool, NeverGivesOneSlotToTwoHolders) {
  SlotPool pool(3, 64);
  std::vector<std::atomic<int>> holders(3);
  std::atomic<int> violations{0}, served{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto s = pool.Acquire();
        if (!s) continue;
        if (holders[*s].fetch_add(1) != 0) violations++;
        holders[*s].fetch_sub(1);
        served++;
        pool.Release(*s);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(served.load(), 16 * 200);  // the queue (64) never overflows with 16 threads
  EXPECT_EQ(pool.busy(), 0u);
}

TEST(SlotPool, CloseWakesWaiters) {
  SlotPool pool(1, 4);
  auto a = pool.Acquire();
  ASSERT_TRUE(a);
  std::optional<uint32_t> got = 7;
  std::thread waiter([&] { got = pool.Acquire(); });
  while (pool.waiting() == 0) std::this_thread::yield();
  pool.Close();
  waiter.join();
  EXPECT_FALSE(got.has_value());
  EXPECT_FALSE(pool.Acquire().has_value());
}

}  // namespace
}  // namespace cachegen::serve
