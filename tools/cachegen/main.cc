// cachegen: command-line front end of the KV-cache codec.
//
//   cachegen encode IN -o OUT.cgkv [rate options]
//   cachegen decode IN.cgkv -o OUT [--level K] [--dtype f16]
//   cachegen inspect IN.cgkv [--json]
//   cachegen bench [IN | --synthetic L,H,D,T] [--codecs LIST] ...
//   cachegen demo
//
// Errors: one line "cachegen: error: ..." on stderr; exit 1 for failures,
// 2 for usage errors.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachegen/cachegen.h"
#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/codec.h"
#include "kv/io.h"
#include "kv/synthetic.h"

namespace cachegen::cli {
namespace {

std::string JoinNames() {
  std::string s;
  for (const auto& n : CodecNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

struct EncodeArgs {
  std::string input, output, codec = "cachegen";
  double bits = 0, snr_db = 0, max_error = 0, max_kl = 0;
  uint32_t levels = 1, chunk_tokens = 256, threads = 0;
  bool json = false;
  // cachegen codec tuning (CodecConfig defaults unless given)
  CodecConfig tuning;
  RopeArgs rope;
  std::string profile;
  bool quantizer_given = false;
};

int RunEncode(const EncodeArgs& a) {
  if (a.codec != "cachegen" && a.levels > 1)
    return Fail(Status::InvalidArgument("--levels " + std::to_string(a.levels) + ": codec " + a.codec +
                                        " codes one rate (only cachegen makes quality levels)"));
  Result<KVTensor> in = LoadInput(a.input);
  if (!in.ok()) return Fail(in.status());
  CodecConfig cfg = a.tuning;
  RopeArgs rope_args = a.rope;
  rope_args.input = a.input;
  Result<RopeConfig> rope = ResolveRope(rope_args);
  if (!rope.ok()) return Fail(rope.status());
  cfg.rope = *rope;
  if (!a.profile.empty())
    if (Status st = UseProfileFile(a.profile, a.quantizer_given, &cfg); !st.ok()) return Fail(st);
  cfg.codec = a.codec;
  cfg.bits_per_value = a.bits;
  cfg.snr_db = a.snr_db;
  cfg.max_rel_error = a.max_error;
  cfg.max_kl = a.max_kl;
  cfg.levels = a.levels;
  cfg.chunk_tokens = a.chunk_tokens;
  cfg.threads = a.threads;
  Result<Encoder> enc = Encoder::Create(cfg);
  if (!enc.ok()) return Fail(enc.status());
  EncodeStats stats;
  Result<std::vector<uint8_t>> bytes = enc->Encode(in->view(), &stats);
  if (!bytes.ok()) return Fail(bytes.status());
  uint64_t unlike_profile = 0;
  for (const FrameStats& fs : stats.frames) unlike_profile += fs.sections_unlike_profile;
  NoteSectionsUnlikeProfile(unlike_profile, stats.frames.size() * 2 * uint64_t{in->shape().layers});
  Status st = WriteFileBytes(a.output, *bytes);
  if (!st.ok()) return Fail(st);
  const double bpv = static_cast<double>(bytes->size()) * 8.0 / static_cast<double>(in->shape().values());
  if (a.json) {
    nlohmann::json j = {{"output", a.output},
                        {"codec", a.codec},
                        {"shape", in->shape().ToString()},
                        {"input_values", in->shape().values()},
                        {"container_bytes", bytes->size()},
                        {"bits_per_value", bpv},
                        {"frames", stats.frames.size()},
                        {"sections_unlike_profile", unlike_profile},
                        {"level_bits_per_value", stats.level_bits_per_value}};
    if (PredictsKl(stats)) j["level_predicted_kl"] = stats.level_predicted_kl;
    std::puts(j.dump(2).c_str());
  } else {
    std::printf("%s: %s, codec %s, %zu bytes, %.3f bits/value (%.2fx vs fp16), %zu frames\n", a.output.c_str(),
                in->shape().ToString().c_str(), a.codec.c_str(), bytes->size(), bpv, 16.0 / bpv, stats.frames.size());
    for (size_t i = 0; i < stats.level_bits_per_value.size(); ++i)
      std::printf("  level %zu: %.3f bits/value%s\n", i, stats.level_bits_per_value[i],
                  PredictsKl(stats) ? fmt::format(", predicted KL {:.3g}", stats.level_predicted_kl[i]).c_str() : "");
  }
  return 0;
}

struct DecodeArgs {
  std::string input, output, dtype, profile;
  uint32_t level = 0, threads = 0;
  uint64_t max_output_bytes = 0;  // 0: DecodeOutputLimit
};

int RunDecode(const DecodeArgs& a) {
  Result<std::shared_ptr<const ProfileSet>> profiles = DecodeProfiles(a.profile);
  if (!profiles.ok()) return Fail(profiles.status());
  Result<std::vector<uint8_t>> bytes = ReadFileBytes(a.input);
  if (!bytes.ok()) return Fail(bytes.status());
  Result<Decoder> dec = Decoder::Open(*bytes, profiles->get());
  if (!dec.ok()) return Fail(Status::Corrupt("'" + a.input + "': " + dec.status().message()));
  DType dtype = dec->info().dtype;
  if (!a.dtype.empty()) {
    Result<DType> d = ParseDType(a.dtype);
    if (!d.ok()) return Fail(d.status());
    dtype = *d;
  }
  Result<KVFileFormat> fmt = KVFileFormatFromPath(a.output);
  if (!fmt.ok()) return Fail(fmt.status());
  Result<KVTensor> t = dec->Decode(dtype, a.level, a.threads, a.max_output_bytes);
  if (!t.ok()) return Fail(t.status());
  Status st = WriteKV(a.output, *t);
  if (!st.ok()) return Fail(st);
  // .npy has no bfloat16: such a tensor is written as f32 (docs/INPUT-FORMATS.md).
  const bool npy_widened = *fmt == KVFileFormat::kNpy && t->dtype() == DType::kBF16;
  std::printf("%s: %s %s, level %u\n", a.output.c_str(), t->shape().ToString().c_str(),
              npy_widened ? "f32 (bf16 widened: .npy has no bf16)" : DTypeName(t->dtype()), a.level);
  return 0;
}

int RunInspect(const std::string& path, bool json) {
  Result<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return Fail(bytes.status());
  Result<Decoder> dec = Decoder::Open(*bytes);
  if (!dec.ok()) return Fail(Status::Corrupt("'" + path + "': " + dec.status().message()));
  const ContainerInfo& info = dec->info();
  const double row_values = static_cast<double>(info.shape.channels());
  nlohmann::json jc = nlohmann::json::array();
  if (!json) {
    std::printf("container: format v%u, codec %s, source dtype %s, %s, token_start %u\n", info.format_version,
                info.codec.c_str(), DTypeName(info.dtype), info.shape.ToString().c_str(), info.token_start);
    std::printf("  %llu bytes, %u levels, chunk_tokens %u, %zu chunks\n", static_cast<unsigned long long>(info.bytes),
                info.levels, info.chunk_tokens, info.chunks.size());
  }
  for (uint32_t c = 0; c < info.chunks.size(); ++c) {
    nlohmann::json jl = nlohmann::json::array();
    for (uint32_t l = 0; l < info.levels; ++l) {
      Result<std::span<const uint8_t>> frame = dec->Frame(c, l);
      if (!frame.ok()) return Fail(frame.status());
      Result<FrameInfo> fi = VerifyFrame(*frame);
      if (!fi.ok()) return Fail(Status::Corrupt("chunk " + std::to_string(c) + " level " + std::to_string(l) + ": " +
                                                fi.status().message()));
      const double sec_values = row_values * fi->shape.tokens;
      const double frame_values = 2.0 * fi->shape.layers * sec_values;
      std::vector<double> bk, bv;
      for (uint64_t b : fi->layer_bytes_k) bk.push_back(static_cast<double>(b) * 8.0 / sec_values);
      for (uint64_t b : fi->layer_bytes_v) bv.push_back(static_cast<double>(b) * 8.0 / sec_values);
      const double bpv = static_cast<double>(fi->bytes) * 8.0 / frame_values;
      const double side = fi->bytes ? static_cast<double>(fi->side_bytes) / static_cast<double>(fi->bytes) : 0;
      if (json) {
        jl.push_back({{"level", fi->level},
                      {"bytes", fi->bytes},
                      {"header_bytes", fi->header_bytes},
                      {"side_bytes", fi->side_bytes},
                      {"side_share", side},
                      {"bits_per_value", bpv},
                      {"layer_bits_k", bk},
                      {"layer_bits_v", bv}});
      } else {
        std::printf("chunk %u tokens [%u, %u) level %u: %llu bytes, %.3f bits/value, header %llu B, side info %.1f%%\n",
                    c, fi->token_start, fi->token_start + fi->shape.tokens, fi->level,
                    static_cast<unsigned long long>(fi->bytes), bpv, static_cast<unsigned long long>(fi->header_bytes),
                    100.0 * side);
        std::printf("  bits/value per layer K:");
        for (double b : bk) std::printf(" %.2f", b);
        std::printf("\n  bits/value per layer V:");
        for (double b : bv) std::printf(" %.2f", b);
        std::printf("\n");
      }
    }
    if (json)
      jc.push_back({{"chunk", c},
                    {"token_start", info.chunks[c].token_start},
                    {"tokens", info.chunks[c].tokens},
                    {"levels", jl}});
  }
  if (json) {
    const KVShape& s = info.shape;
    nlohmann::json j = {{"format_version", info.format_version},
                        {"codec", info.codec},
                        {"dtype", DTypeName(info.dtype)},
                        {"shape", {{"layers", s.layers}, {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim},
                                   {"tokens", s.tokens}}},
                        {"token_start", info.token_start},
                        {"levels", info.levels},
                        {"chunk_tokens", info.chunk_tokens},
                        {"bytes", info.bytes},
                        {"chunks", jc}};
    std::puts(j.dump(2).c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"cachegen: KV-cache codec for LLMs (encode, decode, inspect, benchmark)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("cachegen ") + cg_version());

  EncodeArgs ea;
  CLI::App* enc = app.add_subcommand("encode", "Encode a KV cache into a .cgkv container");
  enc->add_option("input", ea.input, "KV file (.npy, .safetensors, .kvraw) or synthetic:L,H,D,T[,seed]")->required();
  enc->add_option("-o,--output", ea.output, "Output container (.cgkv)")
      ->required()
      ->check(FileExtension(".cgkv", "put and fetch tell a container from a KV file by it"));
  enc->add_option("--codec", ea.codec, "Codec: " + JoinNames())->capture_default_str();
  auto* ob = enc->add_option("--bits", ea.bits, "Target average bits per value (cachegen codec)")
                 ->check(Positive());
  auto* os = enc->add_option("--snr-db", ea.snr_db, "Target per-layer SNR in dB (cachegen codec)")
                 ->check(Positive());
  auto* oe = enc->add_option("--max-error", ea.max_error, "Max |error| / channel std (cachegen codec)")
                 ->check(Positive());
  auto* ok = enc->add_option("--max-kl", ea.max_kl,
                             "Target predicted mean next-token KL (cachegen codec; needs --profile with sensitivities)")
                 ->check(Positive());
  ob->excludes(os)->excludes(oe)->excludes(ok);
  os->excludes(ob)->excludes(oe)->excludes(ok);
  oe->excludes(ob)->excludes(os)->excludes(ok);
  enc->add_option("--levels", ea.levels, "Quality levels per chunk (1-8)")->capture_default_str();
  enc->add_option("--chunk-tokens", ea.chunk_tokens, "Tokens per chunk (0 = one chunk)")->capture_default_str();
  enc->add_option("--threads", ea.threads, "Worker threads (0 = all cores)")->capture_default_str();
  enc->add_flag("--json", ea.json, "Print a JSON summary");
  enc->add_option("--group-tokens", ea.tuning.group_tokens, "cachegen: prediction group size G (0 = default)")
      ->capture_default_str();
  enc->add_flag("--rotate,!--no-rotate", ea.tuning.rotate, "cachegen: per-head Hadamard rotation (default off)");
  enc->add_option("--layer-slope", ea.tuning.layer_slope, "cachegen: >0 gives shallow layers finer steps")
      ->capture_default_str();
  enc->add_option("--key-step-scale", ea.tuning.key_step_scale, "cachegen: K step relative to V (with --bits)")
      ->capture_default_str();
  enc->add_option("--recent-tokens", ea.tuning.recent_tokens, "cachegen: most recent W tokens at finer precision")
      ->capture_default_str();
  enc->add_option("--recent-step-scale", ea.tuning.recent_step_scale,
                  "cachegen: step multiplier of recent tokens (0 = exact f16)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  AddRopeOptions(enc, &ea.rope, /*model_flag=*/true);
  AddQuantizerOption(enc, &ea.tuning, &ea.quantizer_given);
  enc->add_option("--profile", ea.profile,
                  "cachegen: model profile (.cgprof, `cachegen profile train`); frames reference it instead of "
                  "carrying statistics and tables (same --rope/--rotate as it was trained with)");

  DecodeArgs da;
  CLI::App* dec = app.add_subcommand("decode", "Decode a .cgkv container into a KV file");
  dec->add_option("input", da.input, "Container (.cgkv)")->required();
  dec->add_option("-o,--output", da.output, "Output KV file (.npy, .safetensors, .kvraw)")->required();
  dec->add_option("--level", da.level, "Quality level to decode (0 = best)")->capture_default_str();
  dec->add_option("--dtype", da.dtype, "Output dtype f32|f16|bf16 (default: the source dtype)");
  dec->add_option("--threads", da.threads, "Worker threads (0 = all cores)")->capture_default_str();
  dec->add_option("--max-output-bytes", da.max_output_bytes,
                  "Refuse a container that decodes to more bytes (0: 1024 x its size + 64 MiB, docs/FORMAT.md)")
      ->capture_default_str();
  dec->add_option("--profile", da.profile,
                  "Model profile the frames reference (.cgprof; default: the automatic profiles cached here)");

  std::string inspect_path;
  bool inspect_json = false;
  CLI::App* ins = app.add_subcommand(
      "inspect", "Show a container's header, chunks, levels and per-layer bits (verifies every checksum; decodes nothing)");
  ins->add_option("input", inspect_path, "Container (.cgkv)")->required();
  ins->add_flag("--json", inspect_json, "Print JSON");

  std::string bench_input, bench_synth, bench_codecs;
  BenchOptions bo;
  CLI::App* bench = app.add_subcommand("bench", "Compare codecs on one KV cache: size, error, speed");
  auto* bi = bench->add_option("input", bench_input, "KV file or synthetic:L,H,D,T[,seed]");
  auto* bs = bench->add_option("--synthetic", bench_synth, "Synthetic KV L,H,D,T[,seed] (default 8,8,128,1024)");
  bi->excludes(bs);
  bs->excludes(bi);
  bench->add_option("--codecs", bench_codecs, "Comma-separated codecs (default: all)");
  bench->add_option("--bits", bo.bits, "Bits per value target for the cachegen codec")->check(Positive());
  bench->add_option("--reps", bo.reps, "Repetitions; the median is reported")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  bench->add_option("--chunk-tokens", bo.chunk_tokens, "Tokens per chunk")->capture_default_str();
  bench->add_option("--levels", bo.levels, "cachegen: quality levels encoded together (encode MB/s count them all; "
                                           "decodes read level 0)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  bench->add_option("--threads", bo.threads, "Threads for the multi-threaded numbers (0 = all)")->capture_default_str();
  bench->add_flag("--thread-scaling", bo.thread_scaling,
                  "Also measure decode MB/s at 1, 2, ..., --threads threads (speedup vs 1 thread)");
  bench->add_flag("--json", bo.json, "Print exactly one JSON object");
  RopeArgs bench_rope;
  AddRopeOptions(bench, &bench_rope, /*model_flag=*/false);
  std::string bench_profile;
  bench->add_option("--profile", bench_profile,
                    "Model profile (.cgprof): the cachegen codec also runs with it (and its quantizer), as the row "
                    "cachegen+prof, in the same run");
  bench->add_option("--group-tokens", bo.group_tokens, "cachegen: prediction group size G (0 = default)")
      ->capture_default_str();
  std::string bench_dtype = "f16";
  bench->add_option("--dtype", bench_dtype, "Dtype the decodes write (f16, bf16, f32; MB/s count fp16 bytes)")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}))
      ->capture_default_str();

  CLI::App* demo = app.add_subcommand(
      "demo", "With llama.cpp: a trained model's KV compressed by the default codec and restored (size, dPPL, "
              "generated text). With --synthetic, or without llama.cpp: every codec on a synthetic "
              "production-shaped KV cache (32 layers, 8 heads, 128 dims, 512 tokens)");
  std::string demo_synth = "32,8,128,512,1";
  ModelDemoArgs demo_model;
  CLI::Option* demo_synth_opt =
      demo->add_option("--synthetic", demo_synth, "Synthetic KV L,H,D,T[,seed]: the codec table instead");
  // The model demo's options; --synthetic runs no model, so it takes none of them.
  const std::vector<CLI::Option*> demo_model_opts = {
      demo->add_option("--model", demo_model.model,
                       "GGUF model (default: ../shared/models/stories260K.gguf, else a random-weight tiny model)"),
      demo->add_option("--text", demo_model.text, "Text (default: ../shared/data/tinystories/dev.txt, else built in)"),
      demo->add_option("--windows", demo_model.windows, "Text windows of 384 + 128 tokens")
          ->capture_default_str()
          ->check(CLI::Range(1, 1000)),
      demo->add_option("--profile", demo_model.profile,
                       "Run the codec again with this model profile (.cgprof) instead of the model's automatic one")};
  CLI::Option* demo_no_profile =
      demo->add_flag("!--no-profile", demo_model.learn_profile,
                     "No second run with a model profile (by default the model's automatic profile: learned once "
                     "from text the model writes itself, about 1.5 min on stories260K, then read from the cache)")
          ->excludes(demo_model_opts.back());
  for (CLI::Option* o : AddCacheTypeOptions(demo, &demo_model.cache, "the model's context")) demo_synth_opt->excludes(o);
  for (CLI::Option* o : demo_model_opts) demo_synth_opt->excludes(o);
  demo_synth_opt->excludes(demo_no_profile);

  const std::vector<CommandRunner> registered = AddRegisteredCommands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "cachegen: error: %s (see --help)\n", e.what());
    return 2;
  }

  if (*enc) return RunEncode(ea);
  if (*dec) return RunDecode(da);
  if (*ins) return RunInspect(inspect_path, inspect_json);
  if (*bench) {
    std::string name = !bench_input.empty() ? bench_input
                                             : "synthetic:" + (bench_synth.empty() ? "8,8,128,1024" : bench_synth);
    bo.codecs = SplitList(bench_codecs);
    bench_rope.input = bench_input;
    Result<RopeConfig> rope = ResolveRope(bench_rope);
    if (!rope.ok()) return Fail(rope.status());
    bo.rope = *rope;
    Result<DType> out_dtype = ParseDType(bench_dtype);
    if (!out_dtype.ok()) return Fail(out_dtype.status());
    bo.out_dtype = *out_dtype;
    if (!bench_profile.empty()) {
      if (!bo.codecs.empty() && std::find(bo.codecs.begin(), bo.codecs.end(), "cachegen") == bo.codecs.end())
        return Fail(Status::InvalidArgument("--profile runs the cachegen codec with it: add cachegen to --codecs"));
      Result<std::shared_ptr<const Profile>> p = LoadProfileFile(bench_profile);
      if (!p.ok()) return Fail(p.status());
      bo.profile = *p;
    }
    Result<KVTensor> in = LoadInput(name);
    if (!in.ok()) return Fail(in.status());
    Status st = RunBench(*in, name, bo);
    return st.ok() ? 0 : Fail(st);
  }
  if (*demo) {
    if (ModelDemo() && demo_synth_opt->count() == 0) return ModelDemo()(demo_model);
    if (!demo_model.model.empty()) return Fail(Status::Unsupported("demo --model needs a build with llama.cpp"));
    if (!ModelDemo())
      std::printf("(built without llama.cpp: the model demo is not available; see README, \"llama.cpp and eval\")\n");
    const std::string name = "synthetic:" + demo_synth;
    Result<KVTensor> in = LoadInput(name);
    if (!in.ok()) return Fail(in.status());
    std::printf("cachegen demo: every codec on a synthetic KV cache, %s%s\n"
                "(keys with outlier channels, RoPE and token correlation; values per-token scaled)\n\n",
                in->shape().ToString().c_str(), demo_synth_opt->count() == 0 ? " (shaped like an 8B GQA model)" : "");
    BenchOptions d;
    d.reps = 1;
    Status st = RunBench(*in, name, d);
    return st.ok() ? 0 : Fail(st);
  }
  for (const CommandRunner& run : registered)
    if (std::optional<int> rc = run()) return *rc;
  return 2;
}

}  // namespace
}  // namespace cachegen::cli

int main(int argc, char** argv) {
  // The library reports errors as Status; what is left to throw is the
  // standard library, above all an allocation too large for this machine.
  try {
    return cachegen::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "cachegen: error: out of memory (an input or option asks for more than this machine has)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachegen: error: %s\n", e.what());
  }
  return 1;
}
