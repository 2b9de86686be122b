// Crash safety: `cachegen serve` over a file:// store is killed with SIGKILL
// during a burst of writes; after a restart every acknowledged chunk is
// there and every chunk that reads back is exactly what was written.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "cachegen/service.h"
#include "service_util.h"

namespace cachegen {
namespace {

using namespace testing_service;

struct Server {
  pid_t pid = -1;
  int port = 0;
};

// Starts `cachegen serve` on an ephemeral port and reads the port it prints.
Server StartServe(const std::string& store) {
  Server s;
#ifdef CACHEGEN_CLI
  int fds[2];
  if (pipe(fds) != 0) return s;
  s.pid = fork();
  if (s.pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execl(CACHEGEN_CLI, CACHEGEN_CLI, "serve", "--store", store.c_str(), "--listen", "127.0.0.1:0", nullptr);
    _exit(127);
  }
  close(fds[1]);
  FILE* f = fdopen(fds[0], "r");
  char line[512] = {0};
  if (f && fgets(line, sizeof line, f)) {
    const char* p = std::strstr(line, "127.0.0.1:");
    if (p) s.port = std::atoi(p + 10);
  }
  if (f) fclose(f);
#else
  (void)store;
#endif
  return s;
}

TEST(ServeProcess, KillDuringWriteBurstLeavesOnlyWholeChunks) {
#ifndef CACHEGEN_CLI
  GTEST_SKIP() << "built without the cachegen tool";
#else
  const auto dir = TempDir("cachegen-crash-test");
  const std::string uri = "file://" + dir.string();
  Server srv = StartServe(uri);
  ASSERT_GT(srv.port, 0);
  TestContext c = MakeContext(16);
  auto frames = Encoder::Create(c.config)->EncodeChunk(c.kv.view(), 0, 16);
  ASSERT_TRUE(frames.ok());
  const std::vector<uint8_t>& frame = (*frames)[0];

  std::mutex mu;
  std::set<uint64_t> acked, attempted;
  std::atomic<bool> stop{false};
  auto key_of = [](uint64_t i) {
    ChunkKey k;
    for (int b = 0; b < 8; ++b) k.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
    k.bytes[15] = 0x5c;
    return k;
  };
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&, t] {
      auto client = ConnectService("http://127.0.0.1:" + std::to_string(srv.port));
      for (uint64_t i = static_cast<uint64_t>(t); !stop; i += 4) {
        {
          std::lock_guard<std::mutex> lock(mu);
          attempted.insert(i);
        }
        if ((*client)->Put(key_of(i), 0, *BindFrameToChunk(frame, key_of(i))).ok()) {
          std::lock_guard<std::mutex> lock(mu);
          acked.insert(i);
        } else {
          return;  // the server is gone
        }
      }
    });
  // Kill once the burst is under way: at least 40 acknowledged writes (a
  // loaded machine can take longer than a fixed sleep), or after 20 s.
  for (int waited_ms = 0; waited_ms < 20000; waited_ms += 10) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (acked.size() >= 40) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(srv.pid, SIGKILL);
  waitpid(srv.pid, nullptr, 0);
  stop = true;
  for (auto& w : writers) w.join();
  ASSERT_GT(acked.size(), 10u) << "the burst wrote too little to test anything";

  Server again = StartServe(uri);
  ASSERT_GT(again.port, 0);
  auto client = ConnectService("http://127.0.0.1:" + std::to_string(again.port));
  size_t present = 0;
  for (uint64_t i : attempted) {
    auto got = (*client)->Get(key_of(i), 0);
    if (acked.count(i)) {
      ASSERT_TRUE(got.ok()) << "acknowledged chunk " << i << " lost: " << got.status().ToString();
    }
    if (got.ok()) {
      ++present;
      ASSERT_EQ(*got, *BindFrameToChunk(frame, key_of(i))) << "chunk " << i << " differs";
      KVTensor out(c.kv.shape(), DType::kF16);
      ASSERT_TRUE(DecodeFrame(*got, out.view()).ok());
    } else {
      ASSERT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
    }
  }
  EXPECT_GE(present, acked.size());
  std::printf("acknowledged %zu, attempted %zu, present after restart %zu\n", acked.size(), attempted.size(), present);
  client->reset();
  kill(again.pid, SIGTERM);
  waitpid(again.pid, nullptr, 0);
  std::filesystem::remove_all(dir);
#endif
}

}  // namespace
}  // namespace cachegen
