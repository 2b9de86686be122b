// Real redis-server processes for tests: a single server or an N-master
// Redis Cluster on free loopback ports, each in its own temp directory,
// stopped (and the directories removed) by the destructors.
//
//   if (!RedisServerAvailable()) GTEST_SKIP() << kNoRedisServer;
//   RedisCluster cluster;
//   ASSERT_TRUE(cluster.Start(3)) << cluster.error();
//   OpenStore(cluster.Uri());
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace cachegen::testing_redis {

inline constexpr char kNoRedisServer[] = "redis-server/redis-cli not installed (bash scripts/setup.sh installs them)";

// Path of `name` in $PATH, or "".
inline std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    const size_t colon = std::min(p.find(':', pos), p.size());
    const std::string cand = p.substr(pos, colon - pos) + "/" + name;
    if (colon > pos && ::access(cand.c_str(), X_OK) == 0) return cand;
    pos = colon + 1;
  }
  return "";
}

inline bool RedisServerAvailable() { return !FindInPath("redis-server").empty() && !FindInPath("redis-cli").empty(); }

// Whether 127.0.0.1:port can be bound now.
inline bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A port p with p and p + 10000 (the cluster bus) free, from a pid-seeded walk.
inline int FreePort() {
  static int next = 20000 + static_cast<int>(::getpid() % 20000);
  for (int tries = 0; tries < 20000; ++tries) {
    const int p = next;
    next = next + 1 >= 40000 ? 20000 : next + 1;
    if (PortFree(p) && PortFree(p + 10000)) return p;
  }
  return 0;
}

// Runs argv, stdout+stderr to `log`; returns the pid (or -1).
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Runs `redis-cli -p port args...` and returns its stdout (trailing newline cut).
inline std::string RedisCli(int port, const std::string& args) {
  const std::string cmd = "redis-cli -h 127.0.0.1 -p " + std::to_string(port) + " " + args + " 2>&1";
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

class RedisServer {
 public:
  RedisServer() = default;
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() { Stop(); }

  // Starts redis-server on a free port and waits until it answers PING.
  // Several test processes pick ports at once: a port found free may be
  // taken before our server binds it, and then another process's server
  // answers. So the answer must come from our process (INFO's process_id),
  // else it tries the next free port.
  bool Start(bool cluster, const std::vector<std::string>& extra = {}) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      Kill(SIGKILL);
      if (!dir_.empty()) std::filesystem::remove_all(dir_);
      port_ = FreePort();
      dir_ = std::filesystem::temp_directory_path().string() + "/cachegen_redis_" + std::to_string(::getpid()) +
             "_" + std::to_string(port_);
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      std::vector<std::string> argv{"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                    "--dir", dir_, "--save", "", "--appendonly", "no", "--daemonize", "no"};
      if (cluster)
        argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                 "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"});
      argv.insert(argv.end(), extra.begin(), extra.end());
      for (size_t i = 0; i + 1 < extra.size(); ++i)
        if (extra[i] == "--requirepass") auth_ = "--no-auth-warning -a " + extra[i + 1] + " ";
      pid_ = Spawn(argv, dir_ + "/redis.log");
      if (pid_ <= 0) return Fail("cannot spawn redis-server");
      switch (WaitOurs()) {
        case kOurs:
          return true;
        case kTaken:
          continue;
        case kTimeout:
          return Fail("redis-server on port " + std::to_string(port_) + " did not answer PING");
      }
    }
    return Fail("no free port for redis-server after 20 attempts");
  }

  // SIGKILL (crash) or SIGTERM, and reap.
  void Kill(int sig = SIGKILL) {
    if (pid_ > 0) {
      ::kill(pid_, sig);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  void Stop() {
    Kill(SIGKILL);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  std::string Address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& error() const { return error_; }

 private:
  bool Fail(std::string why) {
    error_ = std::move(why);
    return false;
  }
  enum Wait { kOurs, kTaken, kTimeout };
  // Waits until our server answers; kTaken when it exited (cannot bind) or
  // another process's server answers on the port.
  Wait WaitOurs() {
    for (int i = 0; i < 200; ++i) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return kTaken;
      }
      const std::string pong = RedisCli(port_, "PING");
      if (pong == "PONG" || pong.find("NOAUTH") != std::string::npos) {
        const std::string info = RedisCli(port_, auth_ + "INFO server");
        if (info.find("process_id:" + std::to_string(pid_) + "\r") != std::string::npos ||
            info.find("process_id:" + std::to_string(pid_) + "\n") != std::string::npos)
          return kOurs;
        ::usleep(50 * 1000);  // ours exits when it fails to bind; another's keeps answering
        if (::waitpid(pid_, &status, WNOHANG) == pid_) pid_ = -1;
        return kTaken;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return kTimeout;
  }
  int port_ = 0;
  pid_t pid_ = -1;
  std::string dir_, error_, auth_;
};

class RedisCluster {
 public:
  // Starts n masters, joins them with `redis-cli --cluster create`, and waits
  // until every node reports cluster_state:ok.
  bool Start(int n) {
    for (int i = 0; i < n; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>());
      if (!nodes_.back()->Start(true)) return Fail(nodes_.back()->error());
    }
    std::string hosts;
    for (auto& s : nodes_) {
      hosts += ' ';
      hosts += s->Address();
    }
    const std::string out = RedisCli(nodes_[0]->port(), "--cluster create" + hosts + " --cluster-replicas 0 --cluster-yes");
    if (out.find("All 16384 slots covered") == std::string::npos) return Fail("redis-cli --cluster create: " + out);
    for (int i = 0; i < 400; ++i) {
      bool ok = true;
      for (auto& s : nodes_) ok = ok && RedisCli(s->port(), "CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
      if (ok) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return Fail("cluster did not reach cluster_state:ok");
  }

  // "redis-cluster://127.0.0.1:p1,127.0.0.1:p2,..." (`query` appended as is).
  std::string Uri(const std::string& query = "") const {
    std::string u = "redis-cluster://";
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (i) u += ',';
      u += nodes_[i]->Address();
    }
    return u + query;
  }
  RedisServer& node(size_t i) { return *nodes_[i]; }
  size_t size() const { return nodes_.size(); }
  const std::string& error() const { return error_; }
  // Index of the node serving hash slot `slot` (from CLUSTER NODES of node 0), or -1.
  int OwnerOf(int slot) {
    const std::string nodes = RedisCli(FirstRunningPort(), "CLUSTER NODES");
    size_t pos = 0;
    while (pos < nodes.size()) {
      const size_t eol = std::min(nodes.find('\n', pos), nodes.size());
      const std::string line = nodes.substr(pos, eol - pos);
      pos = eol + 1;
      // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <state> <slot ranges...>
      std::vector<std::string> f;
      size_t p = 0;
      while (p < line.size()) {
        const size_t sp = std::min(line.find(' ', p), line.size());
        f.push_back(line.substr(p, sp - p));
        p = sp + 1;
      }
      if (f.size() < 9) continue;
      for (size_t k = 8; k < f.size(); ++k) {
        if (f[k].empty() || f[k][0] == '[') continue;
        const size_t dash = f[k].find('-');
        const int lo = std::stoi(f[k].substr(0, dash));
        const int hi = dash == std::string::npos ? lo : std::stoi(f[k].substr(dash + 1));
        if (slot < lo || slot > hi) continue;
        const std::string port = f[1].substr(f[1].find(':') + 1, f[1].find('@') - f[1].find(':') - 1);
        for (size_t i = 0; i < nodes_.size(); ++i)
          if (std::to_string(nodes_[i]->port()) == port) return static_cast<int>(i);
      }
    }
    return -1;
  }
  int FirstRunningPort() const {
    for (const auto& s : nodes_)
      if (s->running()) return s->port();
    return 0;
  }

 private:
  bool Fail(std::string why) {
    error_ = std::move(why);
    return false;
  }
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::string error_;
};

}  // namespace cachegen::testing_redis
