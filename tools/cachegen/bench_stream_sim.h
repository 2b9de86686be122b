// cachegen bench-stream --simulate and --make-context: the streaming
// simulation (src/stream/sim_table.h) from the command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cachegen::cli {

struct SimulateArgs {
  bool simulate = false;
  std::vector<std::string> traces;  // empty: the shared traces, where present
  std::string time_scales = "100,1000,10000";
  std::string factors = "0.3,0.5,0.75,1,1.5";
  std::vector<std::string> contexts;  // empty: bench/stream/*.json, where present
  double rtt_ms = 1;
  uint32_t trials = 4;
  uint64_t seed = 1;
  double recompute_tps = 5000;
  bool json = false;
  // --make-context
  std::vector<std::string> make_context;  // .cgkv containers, chunks in order
  std::string profile, kl, name, output;
  uint32_t reps = 5;
};

// Adds --simulate's and --make-context's options to bench-stream; `factors`
// is shared with the end-to-end benchmark's --deadline-factors.
void AddSimulateOptions(CLI::App* app, SimulateArgs* args);
// `inflight`: requests in flight of every simulated client (adaptive,
// published, fixed levels).
int RunSimulation(const SimulateArgs& args, const std::string& factors, uint32_t inflight);
int RunMakeContext(const SimulateArgs& args);

}  // namespace cachegen::cli
