// cachegen capture: a model's own KV cache of a text window, as a KV file any
// other command takes (bench, encode, put), with what encoding it needs: the
// window's positions start at 0, and the keys' RoPE is recorded in the
// .safetensors metadata, which encode, bench and put read when neither
// --rope nor --model is given.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/llama_engine.h"
#include "engine/llama/eval.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

struct CaptureArgs {
  std::string model, text, output;
  LlamaCacheTypes cache;
  uint32_t context = 768, window = 0, threads = 0;
};

int RunCapture(CaptureArgs a) {
  Result<ModelAndText> loaded = LoadModelAndText("capture", a.model, a.text);
  if (!loaded.ok()) return Fail(loaded.status());
  a.model = loaded->model_path;
  const std::shared_ptr<LlamaModel>& model = loaded->model;
  const std::string& text_source = loaded->text_source;
  const auto windows = engine::MakeWindows(*model, loaded->text, a.context, a.window + 1);
  if (windows.size() <= a.window)
    return Fail(Status::InvalidArgument(fmt::format("the text has {} window(s) of {} tokens at document starts; "
                                                    "--window {} needs more",
                                                    windows.size(), a.context, a.window)));
  LlamaContextOptions co;
  co.n_ctx = a.context + 8;
  co.cache = a.cache;
  co.model_basis = true;  // keys as the model computed them, whatever the cache stores
  co.threads = a.threads;
  Result<std::unique_ptr<LlamaContext>> ctx = LlamaContext::Create(model, co);
  if (!ctx.ok()) return Fail(ctx.status());
  if (Status st = (*ctx)->Eval(windows[a.window], 0); !st.ok()) return Fail(st);
  Result<CapturedKV> cap = (*ctx)->Capture(0);
  if (!cap.ok()) return Fail(cap.status());
  if (!PositionsFrom(cap->positions, 0)) return Fail(Status::Internal("captured positions are not 0..N-1"));
  const RopeConfig rope = CodecRope(model->info());
  KVMetadata meta = RopeMetadata(rope);
  meta["model"] = a.model.substr(a.model.find_last_of('/') + 1);
  meta["text"] = text_source;
  meta["window"] = std::to_string(a.window);
  meta["position_start"] = "0";
  Status st = a.output.ends_with(".safetensors") ? WriteSafetensors(a.output, cap->kv, meta) : WriteKV(a.output, cap->kv);
  if (!st.ok()) return Fail(st);
  std::printf("%s: %s KV of %u tokens (window %u of %s), %s, positions 0..%u, keys post-RoPE (%s)\n", a.output.c_str(),
              cap->kv.shape().ToString().c_str(), a.context, a.window, text_source.c_str(),
              std::string(DTypeName(cap->kv.dtype())).c_str(), a.context - 1,
              meta["rope"] == "none" ? "no RoPE" : fmt::format("{}, dims {}, theta {}", meta["rope"], meta["rope_dims"], meta["rope_theta"]).c_str());
  if (!a.output.ends_with(".safetensors") && rope.kind != RopeConfig::Kind::kNone)
    std::printf("  not recorded in this format: give --model %s (or --rope ...) to encode and bench\n", a.model.c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(50, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<CaptureArgs>();
  CLI::App* sub = root.add_subcommand(
      "capture", "Write a model's own KV cache of a text window as a KV file (for bench, encode, put)");
  sub->add_option("--model", a->model, std::string("GGUF model (default: ") + kSharedModel + ", else a random-weight tiny model)");
  sub->add_option("--text", a->text, std::string("Text, documents separated by <|endoftext|> lines (default: ") +
                                         kSharedText + ")");
  sub->add_option("--context", a->context, "Tokens in the window (BOS and a document's start first)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--window", a->window, "Which window of the text (0 = the first document start)")->capture_default_str();
  AddCacheTypeOptions(sub, &a->cache, "the context captured (a quantized cache is captured as its f32 values, "
                                      "in the model's basis)");
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: its default)")->capture_default_str();
  sub->add_option("-o,--output", a->output, "KV file: .safetensors (records the keys' RoPE), .npy or .kvraw")->required();
  return [sub, a] { return *sub ? std::optional<int>(RunCapture(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
