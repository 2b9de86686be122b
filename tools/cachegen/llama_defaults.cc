#include "cachegen/llama_defaults.h"

#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include <fmt/format.h>

#include "engine/llama/random_model.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

// Without ../shared (random-weight models: only speed and shape handling are
// measured, and any text will do).
constexpr const char* kFallbackStory =
    "Once upon a time there was a small robot who lived in a quiet town by the sea. Every morning it walked to the "
    "harbour, counted the boats and wrote their names in a notebook. One day a boat came in that had no name at "
    "all. The robot thought for a long time, then painted a name on its side, and the fishermen laughed and "
    "cheered. From then on the robot named every new boat, and the town grew fond of its careful handwriting. ";

}  // namespace

Result<std::string> TextOrDefault(const std::string& tool, const std::string& path, std::string* source) {
  std::string file = path;
  if (file.empty() && std::filesystem::exists(kSharedText)) file = kSharedText;
  if (source) *source = file.empty() ? "built-in" : file;
  if (file.empty()) {
    std::fprintf(stderr, "cachegen %s: no --text and no %s: using a built-in text\n", tool.c_str(), kSharedText);
    std::string t;
    while (t.size() < 40000) t += kFallbackStory;
    return t;
  }
  Result<std::vector<uint8_t>> bytes = ReadFileBytes(file);
  if (!bytes.ok()) return Status::NotFound("cannot read text '" + file + "': " + bytes.status().message());
  return std::string(bytes->begin(), bytes->end());
}

Result<std::string> DefaultModelPath(const std::string& tool, std::string* note) {
  if (std::filesystem::exists(kSharedModel)) return std::string(kSharedModel);
  const std::string path = (std::filesystem::temp_directory_path() / "cachegen-random-tiny.gguf").string();
  const std::string line = "no --model and no " + std::string(kSharedModel) + ": using the random-weight model " +
                           path + " (make-model --shape tiny); its quality numbers and text mean nothing";
  std::fprintf(stderr, "cachegen %s: %s\n", tool.c_str(), line.c_str());
  if (note) *note = line;
  if (std::filesystem::exists(path)) return path;
  Result<engine::RandomModelShape> shape = engine::RandomModelPreset("tiny");
  if (!shape.ok()) return shape.status();
  // Written aside and renamed: a concurrent run never loads a partial file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  Result<uint64_t> w = engine::WriteRandomModel(*shape, tmp);
  if (!w.ok()) return w.status();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return path;
}

Result<std::string> RandomLlama1BPath(const std::string& tool, const std::string& weights) {
  const std::string base = (std::filesystem::temp_directory_path() / "cachegen-llama-3.2-1b-random").string();
  const std::string cached = base + (weights == "f16" ? "" : "-" + weights) + ".gguf";
  if (std::filesystem::exists(cached)) return cached;
  std::fprintf(stderr, "%s: writing a random-weight Llama-3.2-1B-shaped model (%s weights) to %s (once)\n",
               tool.c_str(), weights.c_str(), cached.c_str());
  CG_ASSIGN_OR_RETURN(engine::RandomModelShape shape, engine::RandomModelPreset("llama-3.2-1b"));
  const std::string tmp = cached + ".tmp";
  Result<uint64_t> w = engine::WriteRandomModel(shape, weights == "f16" ? tmp : tmp + ".f16");
  if (w.ok() && weights != "f16") {
    w = engine::QuantizeModel(tmp + ".f16", tmp, weights);
    std::error_code ec;
    std::filesystem::remove(tmp + ".f16", ec);
  }
  if (!w.ok()) return w.status();
  std::filesystem::rename(tmp, cached);
  return cached;
}

Result<engine::AutoProfile> AutoProfileFor(const std::string& tool, const std::string& model_path, uint32_t threads,
                                           bool quiet, const LlamaCacheTypes& types) {
  engine::AutoProfileOptions o;
  o.model_path = model_path;
  o.threads = threads;
  o.cache = types;
  if (!quiet) o.progress = [tool](const std::string& m) { std::fprintf(stderr, "cachegen %s: %s\n", tool.c_str(), m.c_str()); };
  return engine::AutoModelProfile(o);
}

Status UseServeDefaultCoding(const std::string& tool, const std::string& model_path, uint32_t threads, double best_kl,
                             CodecConfig* codec, std::string* coding, const LlamaCacheTypes& types) {
  CG_ASSIGN_OR_RETURN(engine::AutoProfile p, AutoProfileFor(tool, model_path, threads, false, types));
  codec->levels = 4;  // llama-serve's
  codec->profile = p.profile;
  codec->quantizer = p.profile->quantizer().value_or(codec->quantizer);
  codec->max_kl = best_kl > 0 ? best_kl : engine::DefaultBestLevelKl(*p.profile);
  if (coding)
    *coding = codec->max_kl > 0 ? fmt::format("cachegen, automatic profile, best level at predicted KL {:.3g}",
                                              codec->max_kl)
                                : "cachegen, automatic profile, bits default";
  return Status::Ok();
}

Result<ModelAndText> LoadModelAndText(const std::string& tool, const std::string& model, const std::string& text) {
  ModelAndText out;
  out.model_path = model;
  if (out.model_path.empty()) {
    CG_ASSIGN_OR_RETURN(out.model_path, DefaultModelPath(tool));
  }
  CG_ASSIGN_OR_RETURN(out.text, TextOrDefault(tool, text, &out.text_source));
  CG_ASSIGN_OR_RETURN(out.model, LlamaModel::Load(out.model_path));
  return out;
}

}  // namespace cachegen::cli
