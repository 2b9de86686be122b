// ParallelFor (src/common/parallel.h): every index once, the first error
// wins, and an exception in a worker comes back as a status instead of
// ending the process.
#include "common/parallel.h"

#include <atomic>
#include <new>
#include <vector>

#include <gtest/gtest.h>

namespace cachegen {
namespace {

TEST(ParallelFor, RunsEveryIndexOnceWithAnyThreadCount) {
  for (uint32_t threads : {0u, 1u, 3u, 100000u}) {
    std::vector<std::atomic<int>> seen(1000);
    const Status st = ParallelFor(seen.size(), threads, [&](uint64_t i) {
      seen[i].fetch_add(1);
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const auto& s : seen) EXPECT_EQ(s.load(), 1) << threads << " threads";
  }
}

TEST(ParallelFor, AnExceptionInAWorkerIsAnInternalStatus) {
  for (uint32_t threads : {1u, 4u}) {
    const Status st = ParallelFor(64, threads, [](uint64_t i) -> Status {
      if (i == 37) throw std::bad_alloc();
      return Status::Ok();
    });
    EXPECT_EQ(st.code(), StatusCode::kInternal) << threads << " threads";
    EXPECT_NE(st.message().find("out of memory"), std::string::npos) << st.message();
  }
}

TEST(ParallelFor, TheFirstErrorWins) {
  const Status st = ParallelFor(8, 1, [](uint64_t i) {
    return i >= 3 ? Status::Corrupt("item " + std::to_string(i)) : Status::Ok();
  });
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), "item 3");
}

}  // namespace
}  // namespace cachegen
