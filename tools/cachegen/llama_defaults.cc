#include "cachegen/llama_defaults.h"

#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include "engine/llama/random_model.h"

namespace cachegen::cli {

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

}  // namespace cachegen::cli
