// Shared pieces of the cachegen command-line tool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen::cli {

// Prints "cachegen: error: <message>" on stderr and returns the failure exit code (1).
int Fail(const Status& st);

// Splits "a,b,,c" into {"a","b","c"} (empty parts dropped).
std::vector<std::string> SplitList(const std::string& s);

// Parses "L,H,D,T[,seed]" (the part after "synthetic:", or --synthetic's value).
struct SyntheticSpec {
  KVShape shape;
  uint64_t seed = 1;
};
Result<SyntheticSpec> ParseSyntheticSpec(const std::string& spec);

// Loads an input: a KV file (.npy, .safetensors, .kvraw) or "synthetic:L,H,D,T[,seed]"
// (f16, like a production cache).
Result<KVTensor> LoadInput(const std::string& input);

// Quality of a reconstruction against the original, K and V separately.
struct Quality {
  double snr_db_k = 0, snr_db_v = 0;  // +inf when exact
  double max_err_k = 0, max_err_v = 0;
};
Quality Compare(const KVTensor& original, const KVTensor& decoded);

struct BenchOptions {
  std::vector<std::string> codecs;  // empty: all
  double bits = 0;                  // bits_per_value target for rate-controlled codecs; 0 = default
  uint32_t reps = 3;
  uint32_t chunk_tokens = 256;
  uint32_t threads = 0;  // for the "all threads" numbers
  bool thread_scaling = false;  // also decode MB/s at 1, 2, ..., threads threads
  bool json = false;
};

// Runs the benchmark on `input` and prints a table (or one JSON object).
// Returns non-ok only for failures other than codecs reporting kUnsupported.
Status RunBench(const KVTensor& input, const std::string& input_name, const BenchOptions& options);

}  // namespace cachegen::cli
