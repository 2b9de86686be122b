// Per-channel weights of K and V from a model's own attention, for profile
// training (Profile::Train's channel_weights).
//
// First-order effect of coding errors on one layer's attention output, for
// query m of head j over keys n <= m with weights a(m, n) and output
// o = sum_n a v_n, projected by the head's slice W_j of the output matrix:
// - an error e_n in value n moves W_j o by a(m, n) W_j e_n, so V channel d
//   weighs  sum_{j, m, n} a(m, n)^2 (W_j^T W_j)_dd;
// - an error e_n in key n moves the score by u · e_n, u = R(n)^T q_m (keys are
//   coded with RoPE undone; R(n) redoes it), and W_j o by
//   a(m, n) (u · e_n) W_j (v_n - o), so K channel c weighs
//   sum_{j, m, n} a(m, n)^2 |W_j (v_n - o)|^2 u_c^2.
// Errors of different tokens are independent, hence the squared weights.
// Profile::Train moves scales (so steps) towards ∝ 1/sqrt(w_c) within each head;
// how much each section matters downstream is measured separately
// (sensitivity.h). `cachegen profile train` weighs K sections only (V's weights
// measured no gain; docs/EVAL.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/llama_engine.h"
#include "cachegen/status.h"

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
  // [section][kv_head * head_dim + d], section 2l = K, 2l + 1 = V of layer l;
  // empty before any window.
  const std::vector<std::vector<double>>& weights() const { return weights_; }

 private:
  LlamaModelInfo info_;
  RopeConfig rope_;
  std::vector<std::vector<float>> grams_;
  std::vector<std::vector<float>> queries_;  // [layer][token][head][dim] of the current window
  std::vector<std::vector<double>> weights_;
};

}  // namespace cachegen::engine
