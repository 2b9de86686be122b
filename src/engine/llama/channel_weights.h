// Weights of K and V coding errors from a model's own attention, for profile
// training (ProfileTrainOptions::channel_weights).
//
// First-order effect of coding errors on one layer's attention output, for
// query m of head j over keys n <= m with weights a(m, n) and output
// o = sum_n a v_n, projected by the head's slice W_j of the output matrix:
// - an error e_n in value n moves W_j o by a(m, n) W_j e_n, so a V head's
//   error e costs e^T M e with M = sum_{j, m, n} a(m, n)^2 W_j^T W_j;
// - an error e_n in key n moves the score by u · e_n, u = R(n)^T q_m (keys are
//   coded with RoPE undone; R(n) redoes it), and W_j o by
//   a(m, n) (u · e_n) W_j (v_n - o), so for a K head
//   M = sum_{j, m, n} a(m, n)^2 |W_j (v_n - o)|^2 u u^T.
// Errors of different tokens are independent, hence the squared weights.
// The matrices (not only their diagonals) are kept so that a profile's learned
// key transform U can weigh its coded channels by (U^T M U)_cc.
// Profile::Train moves scales (so steps) towards ∝ 1/sqrt(w_c) within each head;
// how much each section matters downstream is measured separately
// (sensitivity.h). `cachegen profile train` weighs K sections only (V's weights
// measured no gain; docs/results/eval.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/llama_engine.h"
#include "cachegen/status.h"

namespace cachegen {
class RopeTable;
}

namespace cachegen::engine {

// W_j^T W_j (head_dim x head_dim) of every layer's attention output matrix,
// [layer][j * D * D + r * D + c], read from the GGUF file (f32, f16, bf16 or
// any type ggml converts to f32).
Result<std::vector<std::vector<float>>> AttentionOutputGrams(const std::string& gguf_path,
                                                             const LlamaModelInfo& info);

class ChannelWeightAccumulator {
 public:
  // `coding_rope`: the RoPE the codec undoes on keys (kind kNone: keys coded
  // as cached); `grams` from AttentionOutputGrams.
  ChannelWeightAccumulator(const LlamaModelInfo& info, const RopeConfig& coding_rope,
                           std::vector<std::vector<float>> grams);
  // For LlamaContextOptions::query_observer: keeps one window's queries.
  void ObserveQueries(uint32_t layer, int32_t pos0, std::span<const float> q);
  // Folds in the window just evaluated from position 0: `kv` is its captured
  // KV (keys after RoPE, as cached), whose tokens the observed queries cover.
  Status AddWindow(const KVView& kv);
  // [section][(kv_head * head_dim + r) * head_dim + c]: per KV head the D x D
  // matrix M above; section 2l = K, 2l + 1 = V of layer l; empty before any window.
  const std::vector<std::vector<double>>& weights() const { return weights_; }

 private:
  struct LayerRows;
  double AddQuery(const LayerRows& rows, const float* qm, uint32_t m, uint32_t h, const float* gram,
                  const RopeTable* rope, double* wk);

  LlamaModelInfo info_;
  RopeConfig rope_;
  std::vector<std::vector<float>> grams_;
  std::vector<std::vector<float>> queries_;  // [layer][token][head][dim] of the current window
  std::vector<std::vector<double>> weights_;
  struct {
    std::vector<double> a, o, diff;
    std::vector<float> u;
  } scratch_;  // AddQuery's working rows
};

}  // namespace cachegen::engine
