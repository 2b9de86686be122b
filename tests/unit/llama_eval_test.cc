// Smoke test of the eval harness: one short window on a random-weight model
// (no ../shared needed), and one on stories260K when ../shared is there.
#include "engine/llama/eval.h"

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <gtest/gtest.h>

#include "engine/llama/random_model.h"

namespace cachegen::engine {
namespace {

const EvalRow* Find(const EvalReport& r, const std::string& codec) {
  for (const auto& row : r.rows)
    if (row.codec == codec) return &row;
  return nullptr;
}

std::string Text() {
  std::string t;
  for (int i = 0; i < 6; ++i) {
    if (i) t += "\n<|endoftext|>\n";
    t += "Story " + std::to_string(i) + ": the cat sat on the mat and looked at the bird in the tree for a while.";
  }
  return t;
}

TEST(LlamaEvalTest, RandomModelOneWindow) {
  const std::string path = ::testing::TempDir() + "/cachegen_eval_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(WriteRandomModel(*RandomModelPreset("tiny"), path).ok());
  EvalOptions o;
  o.model_path = path;
  o.text = Text();
  o.codecs = {"fp16", "q8", "cachegen", "cachegen-ref", "llama-q8_0"};
  o.bits = {2};
  o.context = 32;
  o.continuation = 8;
  o.greedy = 4;
  o.windows = 1;
  o.threads = 1;
  auto rep = RunEval(o);
  std::filesystem::remove(path);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->windows, 1u);
  EXPECT_EQ(rep->rows.size(), 5u);
  EXPECT_TRUE(rep->skipped.empty());
  const EvalRow* fp16 = Find(*rep, "fp16");
  ASSERT_TRUE(fp16);
  // fp16 of an f16 cache is lossless: exactly the exact-KV numbers.
  EXPECT_EQ(fp16->delta_ppl_pct, 0.0);
  EXPECT_EQ(fp16->kl, 0.0);
  EXPECT_EQ(fp16->top1_agreement, 1.0);
  EXPECT_EQ(fp16->greedy_match, 1.0);
  EXPECT_GT(fp16->bits_per_value, 16.0);
  const EvalRow* cg = Find(*rep, "cachegen");
  ASSERT_TRUE(cg);
  EXPECT_GT(cg->kl, 0.0);
  EXPECT_NEAR(cg->ratio_vs_fp16, 16.0 / cg->bits_per_value, 1e-9);
  const EvalRow* q = Find(*rep, "llama-q8_0");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bits_per_value, 8.5);
  EXPECT_GT(rep->ppl_exact, 1.0);
}

// With several levels, each level is a row of its own; level 0 is the frame a
// one-level encode writes (same quality), coarser levels cost fewer bits.
TEST(LlamaEvalTest, LevelsGiveOneRowEachLevelZeroAsOneLevel) {
  const std::string path = ::testing::TempDir() + "/cachegen_eval3_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(WriteRandomModel(*RandomModelPreset("tiny"), path).ok());
  EvalOptions o;
  o.model_path = path;
  o.text = Text();
  o.codecs = {"cachegen"};
  o.bits = {3};
  o.context = 32;
  o.continuation = 8;
  o.greedy = 2;
  o.windows = 1;
  o.threads = 1;
  auto one = RunEval(o);
  o.levels = 3;
  auto three = RunEval(o);
  std::filesystem::remove(path);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  ASSERT_EQ(one->rows.size(), 1u);
  ASSERT_EQ(three->rows.size(), 3u);
  for (uint32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(three->rows[l].level, l);
    EXPECT_EQ(three->rows[l].setting, "bits=3 level=" + std::to_string(l));
  }
  EXPECT_EQ(three->rows[0].ppl, one->rows[0].ppl);
  EXPECT_EQ(three->rows[0].kl, one->rows[0].kl);
  EXPECT_GT(three->rows[0].bits_per_value, three->rows[1].bits_per_value);
  EXPECT_GT(three->rows[1].bits_per_value, three->rows[2].bits_per_value);
  // A level's bits count its own frames, not the whole container.
  EXPECT_LT(three->rows[0].bits_per_value, one->rows[0].bits_per_value * 1.01);
}

TEST(LlamaEvalTest, RejectsUnknownCodecAndShortText) {
  const std::string path = ::testing::TempDir() + "/cachegen_eval2_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(WriteRandomModel(*RandomModelPreset("tiny"), path).ok());
  EvalOptions o;
  o.model_path = path;
  o.text = Text();
  o.codecs = {"zip"};
  o.context = 16;
  o.continuation = 4;
  EXPECT_EQ(RunEval(o).status().code(), StatusCode::kInvalidArgument);
  o.codecs = {"fp16"};
  o.context = 5000;
  EXPECT_EQ(RunEval(o).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
}

TEST(LlamaEvalTest, Stories260KWindowsStartAtStories) {
  std::string model, text;
  for (const std::string root : {"../../shared/", "../shared/"}) {
    if (std::filesystem::exists(root + "models/stories260K.gguf") &&
        std::filesystem::exists(root + "data/tinystories/dev.txt")) {
      model = root + "models/stories260K.gguf";
      text = root + "data/tinystories/dev.txt";
      break;
    }
  }
  if (model.empty()) GTEST_SKIP() << "../shared (stories260K.gguf, dev.txt) not found";
  auto m = LlamaModel::Load(model);
  ASSERT_TRUE(m.ok());
  std::ifstream in(text);
  const std::string t((std::istreambuf_iterator<char>(in)), {});
  const auto w = MakeWindows(**m, t, 513, 1000);
  EXPECT_GT(w.size(), 60u);
  for (const auto& win : w) {
    ASSERT_EQ(win.size(), 513u);
    EXPECT_EQ(win[0], (*m)->info().bos);
  }
  EvalOptions o;
  o.model_path = model;
  o.text = t;
  o.codecs = {"fp16", "q8"};
  o.windows = 1;
  auto rep = RunEval(o);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  // stories260K on TinyStories: perplexity near 3.7 (../shared/notes/kv-sensitivity.md).
  EXPECT_GT(rep->ppl_exact, 2.5);
  EXPECT_LT(rep->ppl_exact, 6.0);
  EXPECT_LT(Find(*rep, "q8")->delta_ppl_pct, 1.0);
}

}  // namespace
}  // namespace cachegen::engine
