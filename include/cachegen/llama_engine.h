// The llama.cpp engine adapter (pinned release v0.4.0) and the few model and
// context calls cachegen's eval needs. Only in builds with llama.cpp
// (CMake target cachegen_llama; see README "llama.cpp").
//
// KV capture and injection go through llama.cpp's public sequence-state API
// (llama_state_seq_get_data / _set_data), parsed and written by cachegen's own
// code (docs/ENGINES.md): f32, f16 and bf16 caches and llama.cpp's quantized
// ones (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; converted by ggml's own block
// routines), V transposed (flash attention off) or not, one or several
// streams. A quantized cache is captured as f32 (its dequantized values, as
// stored: Hadamard-rotated where llama.cpp rotates, see CacheRotationOf,
// unless model_basis), and what Capture gave Injects back to the same blocks.
//
// Not thread-safe: one context is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/engine.h"

struct llama_model;
struct llama_context;
struct ggml_tensor;

namespace cachegen {

// Loads the CPU backends and silences llama.cpp's log (unless CACHEGEN_LLAMA_LOG=1)
// once per process. Called by LlamaModel::Load; non-ok when no backend loads.
Status LlamaInit();

// RoPE parameters of a model, from its GGUF metadata.
struct RopeParams {
  enum class Kind { kNone, kNormal, kNeox, kOther } kind = Kind::kNone;
  uint32_t dims = 0;          // rotated dims per head (rope.dimension_count)
  double freq_base = 10000.0;
  double freq_scale = 1.0;
};

struct LlamaModelInfo;

// The codec's RoPE setting for a model (CodecConfig::rope): its normal or NeoX
// RoPE, or none (kind kNone) for models without RoPE or with another kind
// (M-RoPE, vision...), whose keys are then coded as cached. For keys in the
// model's basis: not for keys captured as a rotated cache stores them
// (LlamaContextOptions::model_basis).
RopeConfig CodecRope(const LlamaModelInfo& info);

// A llama.cpp context's K and V cache types: f32, f16, bf16, q8_0, q4_0,
// q4_1, q5_0, q5_1, iq4_nl.
struct LlamaCacheTypes {
  std::string k = "f16", v = "f16";
  bool operator==(const LlamaCacheTypes&) const = default;
  std::string ToString() const { return k == v ? k : k + "/" + v; }
};

// The orthonormal Walsh-Hadamard rotation (Sylvester order, H = H^T,
// H H = I) the pinned llama.cpp stores a quantized cache's K and V in when
// the head dim is a multiple of 64 (unless LLAMA_ATTN_ROT_DISABLE is set):
// each head's dims in blocks of k_block (the largest power of two dividing
// the head dim) and v_block (64). 0: that part is stored as computed.
struct CacheRotation {
  uint32_t k_block = 0, v_block = 0;
  bool any() const { return k_block != 0 || v_block != 0; }
};
CacheRotation CacheRotationOf(const LlamaModelInfo& info, const LlamaCacheTypes& cache);

// True when positions[t] == first + t for every t: the codec's RoPE handling
// assumes chunk token t sits at position token_start + t.
bool PositionsFrom(std::span<const int32_t> positions, int32_t first);

struct LlamaModelInfo {
  std::string architecture;
  uint32_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0, embd = 0;
  uint32_t vocab = 0, ctx_train = 0;
  int32_t bos = -1, eos = -1;
  RopeParams rope;
  uint64_t params = 0;
};

class LlamaModel {
 public:
  static Result<std::shared_ptr<LlamaModel>> Load(const std::string& path);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaModelInfo& info() const { return info_; }
  llama_model* raw() const { return model_; }
  // Tokens of `text` (no BOS added, no special-token parsing).
  Result<std::vector<int32_t>> Tokenize(const std::string& text) const;
  std::string Detokenize(std::span<const int32_t> tokens) const;

 private:
  LlamaModel() = default;
  llama_model* model_ = nullptr;
  LlamaModelInfo info_;
};

struct LlamaContextOptions {
  uint32_t n_ctx = 512;
  LlamaCacheTypes cache;           // a quantized V needs flash attention (auto turns it on)
  int flash_attn = -1;             // -1 auto, 0 off (V transposed), 1 on
  // Capture and Inject in the model's basis: a cache stored rotated
  // (CacheRotationOf) is rotated back on Capture and rotated again on Inject,
  // so that keys are the model's post-RoPE keys and the codec's RoPE handling
  // and a profile's channel weights apply as for an f16 cache (measured on
  // docs6L with a q8_0 cache: docs/ENGINES.md). Off: the values as stored,
  // and an unchanged round trip is bit-exact. No effect on other caches.
  bool model_basis = false;
  uint32_t n_seq = 1;              // sequences
  bool unified = true;             // false: one stream per sequence
  uint32_t threads = 0;            // 0: 1 for models under 50M parameters, else min(4, hardware)
  uint32_t threads_batch = 0;      // for batches of several tokens (prefill); 0: as threads
  // Offline analysis (profile training): called as Eval computes each layer's
  // queries after RoPE, with the layer, the position of the first token and
  // q as [tokens][heads][head_dim] f32. Setting it splits llama.cpp's graph at
  // every layer's query (slower); the probe evaluation Create makes is not reported.
  std::function<void(uint32_t layer, int32_t pos0, std::span<const float> q)> query_observer;
  // Shutdown: while *abort is true, Eval fails at once, and an Eval running
  // when it is set ends early (llama.cpp's abort callback, checked between
  // the graph's nodes on the CPU backend), so that a long prefill does not
  // hold a server's Stop. The context then holds an unknown part of that
  // batch: Clear it before using it again. Not owned; null: never.
  const std::atomic<bool>* abort = nullptr;
};

class LlamaContext : public EngineAdapter {
 public:
  static Result<std::unique_ptr<LlamaContext>> Create(std::shared_ptr<LlamaModel> model,
                                                      const LlamaContextOptions& options);
  ~LlamaContext() override;
  LlamaContext(const LlamaContext&) = delete;
  LlamaContext& operator=(const LlamaContext&) = delete;

  const LlamaModel& model() const { return *model_; }
  llama_context* raw() const { return ctx_; }

  // Evaluates `tokens` of sequence `seq` at positions pos0, pos0+1, ...
  // With all_logits, Logits(i) is the distribution after tokens[i]; otherwise
  // only after the last token (i = tokens.size() - 1).
  Status Eval(std::span<const int32_t> tokens, int32_t pos0, int32_t seq = 0, bool all_logits = false);
  // Logits (vocab floats) after token i of the last Eval.
  std::span<const float> Logits(size_t i) const;
  // Removes every sequence's tokens.
  void Clear();
  // Per request: while set, an Eval ends early once `cancelled` returns
  // true (polled like LlamaContextOptions::abort, between the graph's
  // nodes) and fails with kUnavailable, so a client that has gone does not
  // keep a long prefill running; Clear the context after. Empty: none. Set
  // it between Evals, not during one.
  void SetCancel(std::function<bool()> cancelled) { cancelled_ = std::move(cancelled); }
  // Removes sequence `seq`'s tokens at positions >= pos.
  Status Truncate(int32_t seq, int32_t pos);

  // The raw sequence-state blob and its inverse.
  Result<std::vector<uint8_t>> StateBlob(int32_t seq) const;
  Status SetStateBlob(int32_t seq, std::span<const uint8_t> blob);

  Result<CapturedKV> Capture(int32_t seq) override;
  Status Inject(int32_t seq, const KVView& kv, std::span<const int32_t> positions = {}) override;
  // Appends `kv` to sequence `seq` at positions pos0, pos0+1, ..., keeping
  // what the sequence already holds (Inject replaces it): pos0 must be one
  // past the sequence's last position. The tokens go in through sequence
  // `scratch` (empty, != seq; needs n_seq >= 2 and a unified cache), whose
  // cells are then shared with `seq` (llama_memory_seq_cp: no data copy).
  // Lets an engine inject a streamed context chunk by chunk as it arrives.
  Status Append(int32_t seq, int32_t scratch, const KVView& kv, int32_t pos0);

 private:
  LlamaContext() = default;
  std::shared_ptr<LlamaModel> model_;
  LlamaContextOptions options_;
  llama_context* ctx_ = nullptr;
  int32_t type_k_ = 1, type_v_ = 1;  // ggml type ids
  CacheRotation rotation_;           // undone on Capture, redone on Inject (model_basis)
  bool v_trans_ = false;
  uint32_t cell_ext_bytes_ = 0;
  // The query observer's state (llama.cpp's eval callback reaches it through `this`).
  static bool ObserveQueries(ggml_tensor* t, bool ask, void* self);
  bool observing_ = false;
  std::function<bool()> cancelled_;  // SetCancel
  // llama.cpp's abort callback: the engine's shutdown flag, or this request's cancel.
  static bool ShouldAbort(void* self);
  std::vector<int32_t> query_pos_;  // per layer: position of the next reported query row
  std::vector<float> query_buf_;
  std::vector<float> logits_;  // outputs x vocab of the last Eval
  size_t outputs_ = 0, first_output_ = 0;
};

}  // namespace cachegen
