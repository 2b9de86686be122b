// Shared pieces of the cachegen command-line tool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <functional>
#include <memory>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/llama_engine.h"
#include "cachegen/status.h"
#include "kv/io.h"

namespace CLI {
class App;
class Option;
class Validator;
}

namespace cachegen::engine {
class GgmlQuantizer;
}

namespace cachegen::cli {

// A byte size with an optional K, M, G or T suffix (powers of 1024), as
// store URIs take them; kInvalidArgument naming `what` otherwise.
Result<uint64_t> ParseByteSize(const std::string& text, const std::string& what);

// --cache-type (both), --cache-type-k and --cache-type-v, the last two
// overriding the first; `what` says which context they are for.
std::vector<CLI::Option*> AddCacheTypeOptions(CLI::App* sub, LlamaCacheTypes* types, const std::string& what);

// RoPE options of a command that encodes (--rope, --rope-dims, --rope-theta,
// --rope-scale; with `model_flag` also --model and --no-rope).
struct RopeArgs {
  std::string kind;  // "", none, normal, neox
  uint32_t dims = 0;
  double theta = 10000.0, scale = 1.0;
  std::string model;  // GGUF to read them from (llama.cpp builds)
  bool off = false;   // --no-rope
  // The KV input: a .safetensors written by `cachegen capture` records its
  // keys' RoPE, used when neither --rope nor --model is given.
  std::string input;
};
void AddRopeOptions(CLI::App* app, RopeArgs* args, bool model_flag);
// --quantizer uniform|lloyd (CodecConfig::quantizer) of a command that
// encodes; `given` (when not null) is set when the option is on the command line.
void AddQuantizerOption(CLI::App* app, CodecConfig* config, bool* given = nullptr);

// Reads and validates a .cgprof.
Result<std::shared_ptr<const Profile>> LoadProfileFile(const std::string& path);
// LoadProfileFile into config->profile. Unless --quantizer was given, the
// config takes the quantizer the profile was trained for (where it says).
Status UseProfileFile(const std::string& path, bool quantizer_given, CodecConfig* config);
// Option checks of a number: finite and > 0, or finite and >= 0 (CLI11's
// own print the whole double range in their message).
CLI::Validator Positive();
CLI::Validator NonNegative();
// Option check: the path ends in `extension` ("why" finishes the message).
CLI::Validator FileExtension(const std::string& extension, const std::string& why);
// Tells on stderr how many of `sections` were too unlike the profile's data to
// use its statistics (FrameStats::sections_unlike_profile), when any were.
void NoteSectionsUnlikeProfile(uint64_t unlike, uint64_t sections);
// Whether the encoder predicted the KL of every level (a profile with
// sensitivities: EncodeStats::level_predicted_kl).
bool PredictsKl(const EncodeStats& stats);
// The codec's RoPE setting: explicit --rope wins, then the --model's GGUF
// (RoPE on when the model has normal/NeoX RoPE, unless --no-rope), then the
// input's capture metadata (unless --no-rope), else none.
Result<RopeConfig> ResolveRope(const RopeArgs& args);
// The RoPE fields of capture metadata (kv/io.h KVMetadata: rope none|normal|
// neox, rope_dims, rope_theta, rope_scale) and back.
Result<RopeConfig> RopeFromMetadata(const KVMetadata& metadata);
KVMetadata RopeMetadata(const RopeConfig& rope);
// Reads a GGUF's RoPE parameters and KV heads; set by the llama.cpp tools at
// start-up (builds without llama.cpp answer kUnsupported).
struct ModelKeyFacts {
  RopeConfig rope;
  uint32_t kv_heads = 0;
};
void SetModelReader(std::function<Result<ModelKeyFacts>(const std::string&)> reader);
Result<ModelKeyFacts> ReadModelKeyFacts(const std::string& gguf);
// A GGUF model's automatic profile (learned once from text the model writes
// itself, then read from the profile cache folder), with where it came from;
// set by the llama.cpp tools at start-up (builds without llama.cpp answer
// kUnsupported).
struct ModelProfileFacts {
  std::shared_ptr<const Profile> profile;
  std::string source;
};
void SetModelProfiler(std::function<Result<ModelProfileFacts>(const std::string&)> profiler);
// ggml's block quantizers for slot files of quantized caches; set by the
// llama.cpp tools at start-up (null in builds without llama.cpp).
void SetBlockQuantizer(const engine::GgmlQuantizer* quantizer);
const engine::GgmlQuantizer* BlockQuantizer();
Result<ModelProfileFacts> AutomaticModelProfile(const std::string& gguf);
// The profiles a decoding command gives its decoder: the .cgprof at
// `profile_path` when one is given, else every profile of the profile cache
// folder, so that frames coded with an automatic profile decode without
// --profile.
Result<std::shared_ptr<const ProfileSet>> DecodeProfiles(const std::string& profile_path);

// `cachegen demo` on a real model (set by the llama.cpp tools at start-up):
// returns the exit code. Empty in builds without llama.cpp.
struct ModelDemoArgs {
  std::string model, text;
  uint32_t windows = 4;
  // The second run's model profile: this file, or the model's automatic
  // profile (learn_profile), or no second run.
  std::string profile;
  bool learn_profile = true;
  LlamaCacheTypes cache;  // the context's, which the restored KV goes back into
};
void SetModelDemo(std::function<int(const ModelDemoArgs&)> demo);
const std::function<int(const ModelDemoArgs&)>& ModelDemo();

// Prints "cachegen: error: <message>" on stderr and returns the failure exit code (1).
int Fail(const Status& st);

// Splits "a,b,,c" into {"a","b","c"} (empty parts dropped).
std::vector<std::string> SplitList(const std::string& s);

// Parses `option`'s value, a comma-separated list of finite numbers > 0
// ("0.3,0.5,1"); kInvalidArgument naming the option and the bad item, or
// an empty list.
Result<std::vector<double>> ParsePositiveList(const std::string& option, const std::string& text);

// Median of v (mean of the middle two for an even count; 0 when empty).
double Median(std::vector<double> v);

// The q-quantile (0 <= q <= 1) of an ascending sample: its element at
// floor(q * size), the last for q = 1; 0 when empty.
double Percentile(const std::vector<double>& sorted, double q);

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
  // cachegen codec: keys' RoPE undone before coding and redone on decode
  // (kind kNone: off), and the prediction group size (0 = default).
  RopeConfig rope;
  uint32_t group_tokens = 0;
  uint32_t levels = 1;  // cachegen rows: quality levels encoded together (decodes read level 0)
  DType out_dtype = DType::kF16;  // what the decodes write (MB/s still count fp16 bytes)
  // A model profile: the cachegen codec also runs with it (and its quantizer),
  // as the row "cachegen+prof" right after "cachegen", in the same run.
  std::shared_ptr<const Profile> profile;
};

// Runs the benchmark on `input` and prints a table (or one JSON object).
// Returns non-ok only for failures other than codecs reporting kUnsupported.
Status RunBench(const KVTensor& input, const std::string& input_name, const BenchOptions& options);

}  // namespace cachegen::cli
