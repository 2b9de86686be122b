// cachegen serve: the HTTP chunk service over a store (docs/SERVICE.md).
#include <csignal>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/service.h"
#include "stream_cli.h"

namespace cachegen::cli {
namespace {

struct ServeArgs {
  std::string store, listen = "127.0.0.1:8471", token_file, rate_limit;
  bool auth_reads = false;
  uint64_t max_body = 64ull << 20;
  uint32_t threads = 64;
  int timeout_ms = 5000;
  ServiceOptions limits;  // connection and body limits
};

int RunServe(const ServeArgs& a) {
  const size_t colon = a.listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    const std::string p = a.listen.substr(colon + 1);
    if (!p.empty() && p.size() <= 5 && p.find_first_not_of("0123456789") == std::string::npos) port = std::stoi(p);
  }
  if (port < 0 || port > 65535) return Fail(Status::InvalidArgument("--listen wants HOST:PORT, got '" + a.listen + "'"));
  ServiceOptions opts;
  opts.host = a.listen.substr(0, colon);
  opts.port = port;
  opts.auth_reads = a.auth_reads;
  opts.max_body_bytes = a.max_body;
  opts.threads = a.threads;
  opts.max_connections = a.limits.max_connections;
  opts.max_connections_per_ip = a.limits.max_connections_per_ip;
  opts.max_inflight_body_bytes = a.limits.max_inflight_body_bytes;
  opts.read_timeout_ms = opts.write_timeout_ms = a.timeout_ms;
  if (!a.token_file.empty()) {
    Result<std::string> token = ReadTokenFile(a.token_file);
    if (!token.ok()) return Fail(token.status());
    opts.token = *token;
  } else {
    if (a.auth_reads) return Fail(Status::InvalidArgument("--auth-reads needs --token-file"));
    std::fprintf(stderr, "cachegen: warning: no --token-file: writes and deletes are not authenticated\n");
  }
  if (!a.rate_limit.empty()) {
    Result<std::vector<RateStep>> trace = ParseRateTrace(a.rate_limit);
    if (!trace.ok()) return Fail(trace.status());
    opts.connection_rate = *trace;
  }
  Result<std::unique_ptr<ChunkStore>> store = OpenStore(a.store);
  if (!store.ok()) return Fail(store.status());

  // Serving threads inherit this mask; the main thread waits for the signal.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  Result<std::unique_ptr<Service>> service = Service::Start(store->get(), opts);
  if (!service.ok()) return Fail(service.status());
  std::printf("cachegen serve: listening on http://%s:%d (store %s)\n", opts.host.c_str(), (*service)->port(),
              (*store)->uri().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  (*service)->Stop();
  return 0;
}

const bool kRegistered = RegisterCommand(20, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = root.add_subcommand("serve", "Serve a chunk store over HTTP (docs/SERVICE.md)");
  sub->add_option("--store", a->store, "Store URI: file:///path, mem://, redis://host:port, redis-cluster://...")
      ->required();
  sub->add_option("--listen", a->listen, "HOST:PORT to listen on (port 0: any free port)")->capture_default_str();
  sub->add_option("--token-file", a->token_file, "File holding the bearer token required for PUT and DELETE");
  sub->add_flag("--auth-reads", a->auth_reads, "Require the token for reads too");
  sub->add_option("--max-body", a->max_body, "Largest accepted request body in bytes")->capture_default_str();
  sub->add_option("--rate-limit", a->rate_limit,
                  "Per-connection send rate, e.g. 1gbit, or a trace 10gbit,0.1gbit@0.5 (RATE@SECONDS steps)");
  sub->add_option("--threads", a->threads, "Requests handled at once (idle and slow connections hold none)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  sub->add_option("--max-connections", a->limits.max_connections, "Connections open at once; more are closed at once")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  sub->add_option("--max-connections-per-ip", a->limits.max_connections_per_ip,
                  "Connections open at once from one client address")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  sub->add_option("--max-inflight-body", a->limits.max_inflight_body_bytes,
                  "Request body bytes received or handled at once, all connections together (more: 503)")
      ->capture_default_str();
  sub->add_option("--timeout-ms", a->timeout_ms,
                  "A request header must come whole within it (not restarted per byte); each body receive and write too")
      ->check(CLI::Range(1, 86400000))
      ->capture_default_str();
  return [sub, a] { return *sub ? std::optional<int>(RunServe(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
