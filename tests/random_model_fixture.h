// Test suites on a tiny random-weight model written by our own tool once per
// suite (src/engine/llama/random_model.h): they need no ../shared. Suites
// that prefer stories260K fall back to it (SharedOrRandomModel).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "cachegen/llama_engine.h"
#include "engine/llama/random_model.h"
#include "shared_data.h"

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
  // What a suite that prefers a trained model runs on: stories260K and the
  // first `shared_chars` of ../shared/<text_rel> where both are there (model
  // null if it fails to load); else this suite's random model and English
  // text of at least `random_chars` characters (about a token a character in its
  // vocabulary, src/engine/llama/random_model.h).
  struct ModelAndText {
    std::shared_ptr<LlamaModel> model;
    std::string text;
    bool stories = false;  // stories260K (else the random model)
    std::string path;      // the model's file
  };
  static ModelAndText SharedOrRandomModel(const std::string& text_rel, size_t shared_chars, size_t random_chars) {
    const std::string model = test_data::SharedPath("models/stories260K.gguf");
    const std::string text = test_data::SharedPath(text_rel);
    if (!model.empty() && !text.empty()) {
      auto m = LlamaModel::Load(model);
      return {m.ok() ? *m : nullptr, test_data::ReadTextFile(text).substr(0, shared_chars), true, model};
    }
    ModelAndText random{model_ ? *model_ : nullptr, "", false, path_};
    while (random.text.size() < random_chars) random.text += "the dog ran to the park. ";
    return random;
  }
  static inline std::string path_;
  static inline uint64_t file_bytes_ = 0;  // as WriteRandomModel reported
  static inline std::shared_ptr<LlamaModel>* model_ = nullptr;
};

}  // namespace cachegen
