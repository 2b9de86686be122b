// Internal: a stored context as the streaming simulation sees it
// (fetch_sim.h), and its JSON form (docs/SERVICE.md, "Streaming
// simulation"), made by `cachegen bench-stream --make-context`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stream/planner.h"
#include "cachegen/status.h"

namespace cachegen::sim {

// Its chunks' frame sizes per level, what each level costs in quality, and
// what decoding costs on the machine it was measured on.
struct SimContext {
  std::string name;
  std::string source;                      // how it was made (the command)
  std::vector<PlanChunk> chunks;           // tokens and per level frame bytes (0 = level absent)
  std::vector<double> level_kl;            // per level: the model's mean KL per token with every chunk at it
  std::vector<double> decode_s_per_token;  // per level: mean decode time of a chunk, per token
  double decode_cv = 0;                    // relative standard deviation of a chunk's decode time

  int levels() const { return static_cast<int>(level_kl.size()); }
  uint64_t LevelBytes(int level) const;  // every chunk's frame at `level`
};

// Checks every field: 1-8 levels, level_kl and decode_s_per_token one per
// level (finite, >= 0), chunks with tokens > 0 and one size per level, at
// least one of them stored; kInvalidArgument says what is wrong.
Result<SimContext> ParseSimContext(const std::string& json);
Result<SimContext> LoadSimContext(const std::string& path);
std::string SimContextJson(const SimContext& context);

}  // namespace cachegen::sim
