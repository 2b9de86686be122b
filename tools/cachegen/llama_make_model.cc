// `cachegen make-model`: writes a random-weight GGUF of a given shape.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "engine/llama/random_model.h"

namespace cachegen::cli {
namespace {

struct MakeModelArgs {
  std::string shape = "llama-3.2-1b";
  std::string out;
  uint32_t layers = 0, ffn = 0;
  uint64_t seed = 1;
  bool f32 = false;
  std::string type = "f16";
};

int RunMakeModel(const MakeModelArgs& a) {
  auto shape = engine::RandomModelPreset(a.shape);
  if (!shape.ok()) return Fail(shape.status());
  if (a.layers) shape->layers = a.layers;
  if (a.ffn) shape->ffn = a.ffn;
  shape->seed = a.seed;
  const std::string type = a.f32 ? "f32" : a.type;
  shape->f16_weights = type != "f32";
  const bool quantize = type != "f16" && type != "f32";
  // Quantized: written in f16 next to the output, then requantized by llama.cpp.
  const std::string raw = quantize ? a.out + ".f16.tmp" : a.out;
  auto bytes = engine::WriteRandomModel(*shape, raw);
  if (bytes.ok() && quantize) bytes = engine::QuantizeModel(raw, a.out, type);
  if (quantize) {
    std::error_code ec;
    std::filesystem::remove(raw, ec);
  }
  if (!bytes.ok()) return Fail(bytes.status());
  std::printf("wrote %s: random %s weights, shape %s (%u layers, width %u, %u heads, %u KV heads, head dim %u, "
              "ffn %u), %.1f MB\n",
              a.out.c_str(), type.c_str(), a.shape.c_str(), shape->layers, shape->embd, shape->heads, shape->kv_heads,
              shape->embd / shape->heads, shape->ffn, static_cast<double>(*bytes) / 1e6);
  return 0;
}

const bool kRegistered = RegisterCommand(60, [](CLI::App& root) -> CommandRunner {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* sub = root.add_subcommand(
      "make-model", "Write a random-weight GGUF model of a production shape (its outputs mean nothing)");
  sub->add_option("--shape", args->shape, "llama-3.2-1b (16 layers, 8 KV heads, head dim 64) or tiny")
      ->capture_default_str();
  sub->add_option("-o,--output", args->out, "Output .gguf path")->required()->check(FileExtension(".gguf", "a GGUF model"));
  sub->add_option("--layers", args->layers, "Override the layer count")->check(CLI::Range(1, 1024));
  sub->add_option("--ffn", args->ffn, "Override the feed-forward width")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--seed", args->seed, "Weight seed")->capture_default_str();
  sub->add_option("--type", args->type, "Weight matrices: f16, f32, or quantized by llama.cpp: q8_0, q4_0, q4_k_m")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0", "q4_k_m"}));
  sub->add_flag("--f32", args->f32, "f32 weight matrices (same as --type f32)");
  return [sub, args] { return *sub ? std::optional<int>(RunMakeModel(*args)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
