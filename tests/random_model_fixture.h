// Test suites on a tiny random-weight model written by our own tool once per
// suite (src/engine/llama/random_model.h): they need no ../shared.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "cachegen/llama_engine.h"
#include "engine/llama/random_model.h"

namespace cachegen {

class TinyRandomModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = ::testing::TempDir() + "/cachegen_random_" + std::to_string(::getpid()) + ".gguf";
    auto shape = engine::RandomModelPreset("tiny");
    ASSERT_TRUE(shape.ok());
    auto bytes = engine::WriteRandomModel(*shape, path_);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    file_bytes_ = *bytes;
    auto m = LlamaModel::Load(path_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = new std::shared_ptr<LlamaModel>(*m);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    std::filesystem::remove(path_);
  }
  // English text of at least `chars` characters: about a token a character
  // in the random model's vocabulary (src/engine/llama/random_model.h).
  static std::string Prompt(size_t chars) {
    std::string text;
    while (text.size() < chars) text += "the dog ran to the park. ";
    return text;
  }
  static inline std::string path_;
  static inline uint64_t file_bytes_ = 0;  // as WriteRandomModel reported
  static inline std::shared_ptr<LlamaModel>* model_ = nullptr;
};

}  // namespace cachegen
