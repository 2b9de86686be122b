// llama-serve's engine: a llama.cpp model whose prompts' KV prefixes load from
// a cachegen chunk store instead of being recomputed.
//
// Per request (Prefill):
//   1. chunk keys of the prompt's whole chunks (the last prompt token is always
//      evaluated, so the first generated token has its logits);
//   2. StreamClient fetches the longest cached prefix under the TTFT deadline,
//      each chunk at the level the bandwidth allows, decoding while fetching;
//   3. each delivered chunk is appended to the slot's sequence as it arrives
//      (LlamaContext::Append), up to the first one the planner gave up on;
//   4. the rest of the prompt is prefilled by the engine.
// After prefill the prompt's whole chunks are captured and, on a background
// thread, encoded at every level and stored (existing chunks are skipped), so
// the next request that shares the prefix hits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/llama_engine.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "serve/completion_server.h"

namespace cachegen {

struct LlamaServeOptions {
  std::string model_name;          // reported by /v1/models; empty: the architecture
  std::string model_fingerprint;   // roots the chunk keys (ModelFingerprint); required with a store
  uint32_t slots = 1;
  uint32_t n_ctx = 4096;
  // llama.cpp K and V cache types (LlamaContextOptions); chunk keys name them
  // unless both are f16 (CacheTypesTag).
  LlamaCacheTypes cache;
  uint32_t threads = 0;            // llama.cpp threads per slot (0: its default)
  uint32_t threads_batch = 0;      // llama.cpp threads for prompt batches (0: as threads)
  // How new chunks are encoded (levels, rate, profile); chunk_tokens = chunk
  // size. A profile must fit the model (shape, RoPE, quantizer: Create fails
  // otherwise); its id and the quantizer are part of the chunk keys.
  CodecConfig codec;
  double ttft_target_ms = 0;       // TTFT target when a request gives none; 0 = best quality, no deadline
  double recompute_tokens_per_s = 0;  // prefill speed for the planner; 0 = measured at start-up
  double token_eval_ms = 0;        // one-token evaluation time; 0 = measured at start-up
  bool store_new_chunks = true;
  // RoPE-aware keys (CodecConfig::rope) from the model's GGUF when codec.rope
  // is unset; false stores keys as cached (post-RoPE).
  bool rope_keys = true;
  uint32_t inflight = 4;           // chunk requests in flight
  uint32_t decode_threads = 0;     // 0: all cores
  int fixed_level = -1;            // >= 0: always fetch this level (benchmarks' fixed-level clients)
  // Start without a chunk coding: no lookups and no stores (every prompt is
  // prefilled) until UseProfile gives one, e.g. once an automatic profile
  // has been learned in the background.
  bool defer_caching = false;
};

// The TTFT part of a request.
struct PrefillResult {
  serve::Timings timings;
  std::vector<uint32_t> recompute_chunks;  // chunks the planner or a failure sent back to the engine
};

class LlamaCompletionEngine final : public serve::CompletionEngine {
 public:
  // `store` may be null (no cache: every prompt is prefilled); not owned.
  static Result<std::unique_ptr<LlamaCompletionEngine>> Create(std::shared_ptr<LlamaModel> model, ChunkStore* store,
                                                               const LlamaServeOptions& options);
  ~LlamaCompletionEngine() override;

  uint32_t slots() const override { return static_cast<uint32_t>(contexts_.size()); }
  std::string model_name() const override { return model_name_; }
  Result<serve::CompletionResult> Complete(uint32_t slot, const serve::CompletionRequest& req,
                                           const std::function<bool(const std::string&)>& on_text) override;
  std::string MetricsText() const override;
  // Every slot's chunk fetch (StreamOptions::cancel) and evaluation
  // (LlamaContextOptions::abort) end early, and later ones fail at once.
  void Abort() override { aborting_ = true; }

  // Tokens of a request's prompt (chat: through the model's chat template).
  Result<std::vector<int32_t>> PromptTokens(const serve::CompletionRequest& req) const;
  // Loads `tokens` into slot `slot`'s sequence (cached prefix + prefill), so
  // that its logits after the last token are ready. ttft_target_ms <= 0: the
  // options' ttft_target_ms; the stream's deadline is the target less the
  // expected evaluation of the uncached tail.
  Result<PrefillResult> Prefill(uint32_t slot, std::span<const int32_t> tokens, double ttft_target_ms);
  // Waits until every queued background store has finished.
  void FlushStores();
  // The KV slot `slot` holds now (after a Prefill: the prompt's).
  Result<CapturedKV> Capture(uint32_t slot);
  // Encodes and stores the whole chunks of `tokens` whose KV is `kv`, now
  // (what the background worker does after a prefill); chunks already stored are skipped.
  Result<PutStats> StoreContext(std::span<const int32_t> tokens, const KVView& kv);

  // Codes and addresses chunks with `profile` from now on (options' codec
  // with the profile, its quantizer, and max_kl when > 0 in place of any bits
  // target; null: the options' codec as it is); requests in flight finish
  // with the previous coding. Fails, keeping the previous coding, when the
  // profile does not fit the model.
  Status UseProfile(std::shared_ptr<const Profile> profile, double max_kl);
  // Whether chunks are looked up and stored (false while defer_caching waits).
  bool caching() const { return Coding() != nullptr; }

  // The key chain's root of the current coding (a zero key while deferred).
  ChunkKey chain_root() const;
  double recompute_tokens_per_s() const { return recompute_tokens_per_s_; }
  // Time to evaluate one token (the last prompt token when the rest is
  // cached): what a TTFT target must leave after the transfer.
  double token_eval_ms() const { return token_eval_ms_; }

 private:
  // The store's counters for MetricsText (with --cache-ram, its memory tier's).
  std::string StoreMetricsText() const;
  LlamaCompletionEngine() = default;
  Status MeasurePrefillSpeed();
  Status MeasureTokenEval();
  void EnqueueStore(std::vector<int32_t> tokens, CapturedKV captured);
  void StoreWorker();
  // Logs a failed prefix lookup (rate-limited); store_mu_ held.
  void LogLookupFailure(const Status& st);

  std::shared_ptr<LlamaModel> model_;
  std::vector<std::unique_ptr<LlamaContext>> contexts_;
  ChunkStore* store_ = nullptr;
  std::unique_ptr<StreamClient> stream_client_;  // one for every request: it reuses decoded tensors
  LlamaServeOptions options_;
  // How chunks are coded and addressed: replaced whole by UseProfile.
  struct ChunkCoding {
    CodecConfig codec;
    ChunkKey root;
    std::unique_ptr<Encoder> encoder;
    // What the chunks under `root` can reference: codec.profile (the root
    // names it), or nothing.
    std::shared_ptr<const ProfileSet> profiles;
  };
  static Result<std::shared_ptr<const ChunkCoding>> MakeCoding(const LlamaModelInfo& info, const LlamaServeOptions& o,
                                                               const CodecConfig& codec);
  std::shared_ptr<const ChunkCoding> Coding() const;
  mutable std::mutex coding_mu_;
  std::shared_ptr<const ChunkCoding> coding_;  // null while caching is deferred
  std::string model_name_;
  double recompute_tokens_per_s_ = 0;
  double token_eval_ms_ = 0;
  std::atomic<double> last_bandwidth_bytes_s_{0};  // planner prior shared by the slots
  std::atomic<bool> aborting_{false};               // Abort, read by every slot's context

  // Background encode+store of new chunks: one worker, a bounded queue (when
  // full, the oldest job is dropped: storing is an optimisation, never a
  // reason to stall or grow without bound).
  struct StoreJob {
    std::vector<int32_t> tokens;
    CapturedKV captured;
  };
  mutable std::mutex store_mu_;
  std::condition_variable store_cv_;
  std::deque<StoreJob> store_queue_;
  bool store_busy_ = false, stopping_ = false;
  uint64_t stored_chunks_ = 0, stored_bytes_ = 0, store_errors_ = 0, store_dropped_ = 0;
  uint64_t sections_unlike_profile_ = 0;  // PutStats::sections_unlike_profile, summed
  uint64_t fetch_errors_ = 0;  // failed prefix lookups and chunks (StreamResult::errors), under store_mu_
  // Failed lookups are logged at most every kLookupLogInterval; the ones in
  // between are counted into the next line (a store that is down fails every
  // request). Under store_mu_.
  std::chrono::steady_clock::time_point last_lookup_log_{};
  uint64_t lookup_failures_unlogged_ = 0;
  std::thread store_thread_;
};

// A model's fingerprint for chunk keys: its architecture, shape and a hash of
// the GGUF file's bytes (weights included: chunks of different weights never mix).
Result<std::string> ModelFingerprint(const std::string& gguf_path, const LlamaModelInfo& info);

// What chunk keys and automatic profiles add to a model fingerprint for a
// cache of these K/V types: "" for f16/f16 (so that keys of f16 caches stay
// as they were), else ":kv=K/V". A chunk captured from a q4_0 cache holds
// other values (quantized, maybe Hadamard-rotated) than one from f16.
std::string CacheTypesTag(const LlamaCacheTypes& cache);

}  // namespace cachegen
