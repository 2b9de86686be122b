// Locating ../shared (models and data beside the repository) from tests,
// which run from the build folder (whose parent is the repository root) or
// from the repository root.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace cachegen::test_data {

// The path of `rel` under ../shared, or "" when it is absent (tests skip then).
inline std::string SharedPath(const std::string& rel) {
  for (const std::string& p : {"../../shared/" + rel, "../shared/" + rel})
    if (std::filesystem::exists(p)) return p;
  return "";
}

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace cachegen::test_data
