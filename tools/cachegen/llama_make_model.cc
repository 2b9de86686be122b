// `cachegen make-model`: writes a random-weight GGUF of a given shape.
#include <cstdio>
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
};

int RunMakeModel(const MakeModelArgs& a) {
  auto shape = engine::RandomModelPreset(a.shape);
  if (!shape.ok()) return Fail(shape.status());
  if (a.layers) shape->layers = a.layers;
  if (a.ffn) shape->ffn = a.ffn;
  shape->seed = a.seed;
  shape->f16_weights = !a.f32;
  auto bytes = engine::WriteRandomModel(*shape, a.out);
  if (!bytes.ok()) return Fail(bytes.status());
  std::printf("wrote %s: random weights, shape %s (%u layers, width %u, %u heads, %u KV heads, head dim %u, "
              "ffn %u), %.1f MB\n",
              a.out.c_str(), a.shape.c_str(), shape->layers, shape->embd, shape->heads, shape->kv_heads,
              shape->embd / shape->heads, shape->ffn, static_cast<double>(*bytes) / 1e6);
  return 0;
}

const bool kRegistered = RegisterCommand(60, [](CLI::App& root) -> CommandRunner {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* sub = root.add_subcommand(
      "make-model", "Write a random-weight GGUF model of a production shape (its outputs mean nothing)");
  sub->add_option("--shape", args->shape, "llama-3.2-1b (16 layers, 8 KV heads, head dim 64) or tiny")
      ->capture_default_str();
  sub->add_option("-o,--output", args->out, "Output .gguf path")->required();
  sub->add_option("--layers", args->layers, "Override the layer count");
  sub->add_option("--ffn", args->ffn, "Override the feed-forward width");
  sub->add_option("--seed", args->seed, "Weight seed")->capture_default_str();
  sub->add_flag("--f32", args->f32, "f32 weight matrices instead of f16");
  return [sub, args] { return *sub ? std::optional<int>(RunMakeModel(*args)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
