// The evaluation harness behind `cachegen eval`: how much a codec's KV
// compression costs a real model, judged by the model itself.
//
// For each window of text (N context tokens + M scored tokens + 1): prefill the
// N context tokens exactly, capture their KV, and for every codec and rate
// encode it, decode it, inject it into a second context, and score the next M
// tokens by teacher forcing (inputs tokens N..N+M-1, targets N+1..N+M), then
// generate `greedy` tokens greedily from token N. The exact KV goes through the
// same inject path and is the reference for ΔPPL, KL, top-1 and greedy match.
// llama.cpp's own quantized cache types ("llama-q8_0", "llama-q4_0", any
// quantized type of GgmlCacheTypeByName) run as contexts of that type that
// prefill and score on their own (their context KV is quantized while it is
// computed, as in the engine). With quantized cache types of its own, the
// exact context's KV is its dequantized cache, and decoded KV goes back into
// such a cache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/llama_engine.h"
#include "cachegen/status.h"

namespace cachegen::engine {

struct EvalOptions {
  std::string model_path;
  std::string text;  // the text itself; stories separated by lines "<|endoftext|>"
  // Codec names (CodecNames()) and "llama-TYPE" for llama.cpp's quantized cache types.
  std::vector<std::string> codecs;
  std::vector<double> bits;  // rates of the rate-controlled codec (cachegen)
  // cachegen: KL targets (CodecConfig::max_kl), a row each after the bits
  // rows; needs codec.profile with sensitivities.
  std::vector<double> max_kl;
  // cachegen: quality levels per chunk. With more than one, each rate gives a
  // row per level ("bits=B level=K"), decoded at that level; its bits/value
  // count that level's frames only.
  uint32_t levels = 1;
  // RoPE-aware keys for the cachegen codec with the model's parameters
  // (CodecRope); false codes keys as cached (post-RoPE).
  bool rope = true;
  uint32_t context = 384, continuation = 128, windows = 16, greedy = 32;
  // The exact context's cache (LlamaContextOptions), which the KV is captured from and injected into.
  LlamaCacheTypes cache;
  int flash_attn = -1;
  uint32_t threads = 0;
  CodecConfig codec;  // tuning for every codec (codec, bits_per_value and threads are set per row)
  std::function<void(const std::string&)> progress;  // one line per step, may be empty
};

struct EvalRow {
  std::string codec, setting;
  uint32_t level = 0;  // the decoded quality level (EvalOptions::levels)
  double bits_per_value = 0, ratio_vs_fp16 = 0;
  double ppl = 0, delta_ppl_pct = 0, kl = 0, top1_agreement = 0, greedy_match = 0;
  // cachegen with a profile that has sensitivities: the encoder's predicted
  // KL (EncodeStats::level_predicted_kl), mean over windows; < 0 otherwise.
  double predicted_kl = -1;
  double encode_s = 0, decode_s = 0;  // totals over windows
  std::string sample;  // first window: the text generated greedily with this row's KV
};

struct EvalSkip {
  std::string codec, reason;
};

struct EvalReport {
  std::string model;
  LlamaModelInfo info;
  uint32_t windows = 0, context = 0, continuation = 0, greedy = 0;
  double ppl_exact = 0;
  std::vector<EvalRow> rows;
  std::vector<EvalSkip> skipped;
  // First window: the text generated greedily with the exact KV, and the
  // last tokens before it (the context's end and token N).
  std::string sample_exact, sample_lead;
};

// Token windows of length context + continuation + 1, each starting at a story
// start (BOS + story tokens, stories joined), not overlapping. At most `max`.
std::vector<std::vector<int32_t>> MakeWindows(const LlamaModel& model, const std::string& text, uint32_t length,
                                              uint32_t max);

Result<EvalReport> RunEval(const EvalOptions& options);

// Teacher forcing: with sequence 0 of `ctx` holding the KV of w[0, N), feeds
// w[N, N + M) at positions N.. and stores the M next-token log-probabilities
// (logp[i] after token N + i). Leaves those tokens in the sequence.
Status TeacherForcedLogProbs(LlamaContext& ctx, std::span<const int32_t> w, uint32_t N, uint32_t M,
                             std::vector<std::vector<float>>* logp);
// KL(exact || other) of two log-probability vectors, clamped at 0 (rounding).
double KLDivergence(std::span<const float> exact_logp, std::span<const float> logp);

}  // namespace cachegen::engine
