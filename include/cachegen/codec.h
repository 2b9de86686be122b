// Encoder and Decoder: KV tensors to a cachegen container and back.
//
// A container (.cgkv) holds a context's KV split into chunks of tokens; each
// chunk is encoded at one or more quality levels as a self-contained *frame*
// (docs/FORMAT.md). Frames are what a chunk store keeps and streams; each
// frame's layers decode independently.
//
// Thread safety: Encoder and Decoder are immutable after creation; all const
// methods may be called concurrently. The free frame functions are reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"
#include "cachegen/chunk_key.h"

namespace cachegen {

// Codec names accepted by CodecConfig::codec.
//   cachegen      the product codec (rate-controlled, see docs/FORMAT.md)
//   fp16          raw IEEE half
//   fp16-zstd     zstd level 3 over raw half
//   q8, q4        block-32 symmetric quantization with an f16 scale (q8_0/q4_0-like)
//   kivi2, kivi4  KIVI: per-channel keys, per-token values, group 32, recent 128 tokens f16
//   cachegen-ref  the published CacheGen/LMCache quantizer + per-channel entropy coding
std::vector<std::string> CodecNames();

// Rotary position embedding of the keys (`cachegen` codec only). Engines such
// as llama.cpp cache keys after RoPE; with a kind set, the encoder undoes the
// rotation before coding (key of chunk token t at position token_start + t)
// and the decoder redoes it, so the decoded keys are again post-RoPE. The
// parameters travel in the frame (docs/FORMAT.md), so any decoder restores the
// same keys; wrong parameters cost compression, never correctness.
// Conventions of ggml_rope_ext without YaRN (see src/codec/cachegen/rope.h).
struct RopeConfig {
  enum class Kind : uint8_t { kNone = 0, kNormal = 1, kNeox = 2 };
  Kind kind = Kind::kNone;
  uint32_t dims = 0;        // rotated dims per head (even, <= head_dim); 0 = head_dim
  double freq_base = 10000.0;  // "theta"; stored as f32
  double freq_scale = 1.0;     // stored as f32
};

class Profile;     // cachegen/profile.h
class ProfileSet;  // cachegen/profile.h

// The `cachegen` codec's rate when no target is set (bits per value).
inline constexpr double kDefaultBitsPerValue = 2.0;
// With a max_kl target, each quality level below the first predicts this many
// times the previous level's KL (half a decade).
inline constexpr double kLevelKlRatio = 3.1622776601683795;

struct CodecConfig {
  std::string codec = "cachegen";

  // Rate control for the `cachegen` codec: at most one target may be set
  // (> 0). With none set, bits_per_value = kDefaultBitsPerValue is used. Levels below the first
  // follow the rule in docs/FORMAT.md ("The cachegen codec", encoder choices).
  double bits_per_value = 0;  // average bits per value, all side information included
  double snr_db = 0;          // per-layer signal-to-noise ratio of K and V
  double max_rel_error = 0;   // max |error| / channel standard deviation
  // Predicted mean next-token KL divergence of the restored context (nats),
  // from the model profile's measured section sensitivities: every section
  // gets the step at which its predicted share is equal and the shares sum to
  // max_kl (each level below the first: kLevelKlRatio times the previous
  // level's target). Needs a profile with sensitivities (Encoder::Create
  // refuses it otherwise). FrameStats::predicted_kl reports the prediction.
  double max_kl = 0;
  std::vector<double> level_bits;  // explicit per-level bits targets (overrides `levels`)
  uint32_t levels = 1;             // quality levels per chunk, 1..8

  uint32_t chunk_tokens = 256;  // tokens per chunk; 0 = the whole context as one chunk

  // `cachegen` codec tuning; defaults chosen by measurement (see bench/).
  uint32_t group_tokens = 0;   // prediction group size G; 0 = codec default
  // Per-head Hadamard rotation (head_dim a power of two). Off by default: on
  // synthetic KV it gained about 0.1 dB at 2 bits/value while costing a quarter
  // of decode time; to be re-measured on real models.
  bool rotate = false;
  double layer_slope = 0.0;    // >0: shallow layers get finer steps (see FORMAT.md)
  // Step of every K section relative to the V sections of the same layer in
  // bits-targeted rate control (1 = one step for both; < 1: finer keys, which
  // attention is more sensitive to). Default 0.4 measured with `cachegen eval`
  // on stories260K (docs/results/eval.md): at 2-3 bits/value it cut ΔPPL 2-5x vs 1.0.
  double key_step_scale = 0.4;
  // RoPE handling of keys; off (kNone) by default for plain KV files. The
  // llama.cpp paths (eval, llama-serve, slot compress with --model) turn it on
  // from the GGUF: it measured 3-10x lower ΔPPL at equal bits (docs/results/eval.md).
  RopeConfig rope;
  // A model profile (cachegen/profile.h): frames reference it by id instead of
  // carrying channel statistics and frequency tables. Its rope and rotate
  // settings must equal this config's. Decoding needs it given to the
  // decoder (a ProfileSet holding it).
  std::shared_ptr<const Profile> profile;
  // Scalar quantizer of the `cachegen` codec. kUniform: levels at multiples
  // of the step, nearest level. kLloyd: per section a learned codebook moves
  // the levels of the smaller symbols to the centroids of their bins (stored
  // in the section, FORMAT.md "Reconstruction codebook"), and the encoder picks
  // levels by distortion plus a rate term (entropy-constrained, iterated
  // Lloyd-style). Opt-in; measured in docs/results/eval.md.
  enum class Quantizer : uint8_t { kUniform = 0, kLloyd = 1 };
  Quantizer quantizer = Quantizer::kUniform;
  uint32_t recent_tokens = 0;  // most recent W tokens of the context at higher precision
  double recent_step_scale = 0.5;  // their step multiplier; 0 = exact f16

  uint32_t threads = 0;  // 0 = hardware concurrency
};

// What one frame (chunk × level) costs, as measured on the encoded bytes.
struct FrameStats {
  uint32_t chunk = 0;
  uint32_t level = 0;
  uint32_t token_start = 0;
  uint32_t tokens = 0;
  uint64_t bytes = 0;       // whole frame, headers included
  uint64_t side_bytes = 0;  // scales, tables, codebooks
  // Per layer: bits per value of K and of V payloads (side info included).
  std::vector<double> layer_bits_k, layer_bits_v;
  double bits_per_value = 0;  // bytes * 8 / values
  // Encoding with a model profile: sections whose data was too unlike the
  // profile's training data to use its statistics, coded with their own
  // instead (docs/FORMAT.md, "Model profiles"). Many such sections suggest
  // the profile of another model.
  uint32_t sections_unlike_profile = 0;
  // The mean next-token KL the model is predicted to see when this frame's
  // tokens are restored from it (sum over sections of the profile's measured
  // sensitivity times the squared step used); < 0 when not predicted (no
  // profile with sensitivities, or another codec).
  double predicted_kl = -1;
};

struct EncodeStats {
  uint64_t input_values = 0;
  uint64_t container_bytes = 0;
  std::vector<FrameStats> frames;
  // Average over chunks of one level, every byte of the container included
  // (container header and index spread over levels by their share).
  std::vector<double> level_bits_per_value;
  // Per level: the frames' predicted KL averaged over the context's tokens
  // (FrameStats::predicted_kl); < 0 when not predicted.
  std::vector<double> level_predicted_kl;
};

class EncoderScratchPool;

class Encoder {
 public:
  static Result<Encoder> Create(const CodecConfig& config);
  const CodecConfig& config() const { return config_; }

  // Encodes a whole context into a container. `token_start` is the absolute
  // position of the view's first token (for multi-turn appends).
  Result<std::vector<uint8_t>> Encode(const KVView& kv, EncodeStats* stats = nullptr,
                                      uint32_t token_start = 0) const;

  // Encodes one chunk at every configured level into standalone frames
  // (index = level). `context_tokens` is the context length the chunk belongs
  // to (for recency allocation); 0 means token_start + chunk tokens.
  Result<std::vector<std::vector<uint8_t>>> EncodeChunk(const KVView& chunk, uint32_t token_start,
                                                        uint32_t context_tokens,
                                                        std::vector<FrameStats>* stats = nullptr) const;

 private:
  explicit Encoder(CodecConfig config);
  CodecConfig config_;
  // Working memory of finished chunk encodes, reused by the next ones (an
  // encoder keeps about one chunk's worth per concurrent chunk; copies share it).
  std::shared_ptr<EncoderScratchPool> scratch_;
};

// Header facts of one frame, read without decoding its payload.
struct FrameInfo {
  std::string codec;
  uint32_t format_version = 0;
  DType dtype = DType::kF16;  // dtype of the encoded source
  KVShape shape;              // tokens = tokens of this frame
  uint32_t level = 0;
  uint32_t token_start = 0;
  uint32_t context_tokens = 0;
  // The chunk key the frame is bound to (format version 2, BindFrame); unset
  // for a frame of a container, or one not stored under a key.
  std::optional<ChunkKey> chunk_key;
  uint64_t bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t side_bytes = 0;
  // Per layer payload bytes of K and V (side info included).
  std::vector<uint64_t> layer_bytes_k, layer_bytes_v;
};

// Validates a frame's header and returns its facts (payload checksums are
// verified on decode, or by VerifyFrame).
Result<FrameInfo> InspectFrame(std::span<const uint8_t> frame);
// InspectFrame, and every section payload against its checksum, without
// decoding: kCorrupt names the first damaged section. What a store or a
// tool checks before it keeps or vouches for a frame.
Result<FrameInfo> VerifyFrame(std::span<const uint8_t> frame);
// The most bytes of decoded KV the library allocates for `input_bytes` of
// frames or container: 1024 x input + 64 MiB (docs/FORMAT.md, "Decode
// bound"). Coded KV is far smaller than that ratio (all-zero KV in
// 4096-token chunks, the most compressible there is, codes at 3945 x
// smaller than f16); a header claiming more from few bytes is an attack or
// damage, refused before anything is allocated.
uint64_t DecodeOutputLimit(uint64_t input_bytes);

// The same frame bound to the chunk key it is stored under (format version
// 2): a reader that fetched it as chunk `key` can tell it from a frame stored
// under the wrong key. Section payloads are unchanged; kCorrupt when `frame`
// does not parse. Every put path (PutContext, PutContainer, `cachegen store
// put`) binds; the chunk service refuses frames bound to another key.
Result<std::vector<uint8_t>> BindFrameToChunk(std::span<const uint8_t> frame, const ChunkKey& key);
// Decodes a whole frame into `out` (shape must equal the frame's shape; any
// dtype). A frame coded with a model profile needs it in `profiles` (null: no
// profiles; such a frame then fails with kNotFound).
Status DecodeFrame(std::span<const uint8_t> frame, const KVView& out, uint32_t threads = 1,
                   const ProfileSet* profiles = nullptr);
// Decodes one layer of a frame: writes only that layer of `out`.
Status DecodeFrameLayer(std::span<const uint8_t> frame, uint32_t layer, const KVView& out,
                        const ProfileSet* profiles = nullptr);

struct ChunkEntry {
  uint32_t token_start = 0;
  uint32_t tokens = 0;
  std::vector<uint64_t> frame_offset;  // per level, from the container start
  std::vector<uint64_t> frame_size;
};

struct ContainerInfo {
  uint32_t format_version = 0;
  std::string codec;
  DType dtype = DType::kF16;
  KVShape shape;  // whole context
  uint32_t token_start = 0;
  uint32_t levels = 0;
  uint32_t chunk_tokens = 0;
  uint64_t bytes = 0;
  std::vector<ChunkEntry> chunks;
};

class Decoder {
 public:
  // Validates the container header and chunk index. The bytes are not copied:
  // they must outlive the Decoder, and so must `profiles`: the model profiles
  // its frames may reference (null: none; DecodeFrame).
  static Result<Decoder> Open(std::span<const uint8_t> container, const ProfileSet* profiles = nullptr);
  const ContainerInfo& info() const { return info_; }

  // Decodes every chunk at `level` into `out` (shape = info().shape).
  Status Decode(const KVView& out, uint32_t level = 0, uint32_t threads = 0) const;
  // The same into a tensor it allocates, of at most `max_output_bytes`
  // (0: DecodeOutputLimit of the container's size); a container that claims
  // more is refused before anything is allocated (kInvalidArgument).
  Result<KVTensor> Decode(DType dtype, uint32_t level = 0, uint32_t threads = 0,
                          uint64_t max_output_bytes = 0) const;
  // The frame of chunk `chunk` at `level`.
  Result<std::span<const uint8_t>> Frame(uint32_t chunk, uint32_t level) const;

 private:
  Decoder() = default;
  std::span<const uint8_t> bytes_;
  const ProfileSet* profiles_ = nullptr;
  ContainerInfo info_;
};

}  // namespace cachegen
