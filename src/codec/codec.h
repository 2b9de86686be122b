// The internal codec interface. Every codec — the product codec and each
// baseline — turns one chunk (all layers, K and V, f32) into per-level sets of
// sections, one section per (layer, K|V). The frame layer (src/format) wraps
// sections with headers, offsets and checksums; codecs only see payloads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {

// Stable on-disk codec identifiers (docs/FORMAT.md). Never renumber.
enum class CodecId : uint8_t {
  kFp16 = 1,
  kFp16Zstd = 2,
  kQ8 = 3,
  kQ4 = 4,
  kKivi2 = 5,
  kKivi4 = 6,
  kCacheGenRef = 7,
  kCacheGen = 8,
};

// Working memory a codec keeps from one chunk to the next an encoder codes
// (a codec defines its own subclass; see ChunkF32::scratch).
struct EncodeScratch {
  virtual ~EncodeScratch() = default;
};

// One chunk in f32, contiguous [layer][K|V][token][channel], channel = head*head_dim + dim.
struct ChunkF32 {
  KVShape shape;              // tokens = tokens in this chunk
  DType source_dtype = DType::kF16;
  uint32_t token_start = 0;   // absolute position of token 0
  uint32_t context_tokens = 0;  // length of the context the chunk belongs to
  std::span<const float> data;
  // Optional: where the codec may keep its working memory between chunks
  // (large buffers reused instead of being allocated and faulted in again).
  // The codec replaces an object of another type; null: none kept.
  std::unique_ptr<EncodeScratch>* scratch = nullptr;

  std::span<const float> Section(uint32_t layer, KV kv) const {
    const uint64_t n = uint64_t{shape.tokens} * shape.channels();
    return data.subspan((uint64_t{layer} * 2 + static_cast<uint8_t>(kv)) * n, n);
  }
};

struct EncodedSection {
  std::vector<uint8_t> bytes;
  uint32_t side_bytes = 0;  // of bytes, how many are side information (scales, tables...)
  // cachegen with a model profile: the section's data was too unlike the
  // profile's to use its statistics (coded with its own).
  bool unlike_profile = false;
};

struct EncodedLevel {
  std::vector<uint8_t> params;           // codec parameters stored in the frame header
  std::vector<EncodedSection> sections;  // 2 * layers, order (layer 0 K, layer 0 V, layer 1 K, ...)
  double predicted_kl = -1;              // FrameStats::predicted_kl
};

// What a decoder knows about a section before reading its payload: all
// header fields of its frame. Every field comes from an untrusted stream, but
// the frame parser has validated shape limits.
struct SectionContext {
  KVShape shape;  // of the frame
  uint32_t layer = 0;
  KV kv = KV::kKey;
  uint32_t level = 0;
  uint32_t token_start = 0;
  uint32_t context_tokens = 0;
  std::span<const uint8_t> params;  // the frame's codec params, untrusted
  // The model profiles the frame may reference (null: none); not owned.
  const ProfileSet* profiles = nullptr;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  virtual std::string_view name() const = 0;

  // Encodes a chunk at every level the config asks for (baselines with a fixed
  // rate produce one level regardless). Must be deterministic.
  virtual Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig& config) const = 0;

  // Decodes one section into out: tokens * channels floats, row-major.
  // `payload` is untrusted: any byte string must yield ok or a Status, never
  // UB, and must terminate in time linear in its length plus the output size.
  virtual Status DecodeSection(const SectionContext& ctx, std::span<const uint8_t> payload,
                               std::span<float> out) const = 0;

  // Decodes one section straight into section (ctx.layer, ctx.kv) of `out`
  // (the frame's shape, any dtype/strides). The default decodes into
  // `scratch` with DecodeSection and converts row by row; codecs with a fused
  // path override it. Same contract on untrusted payloads.
  virtual Status DecodeSectionToView(const SectionContext& ctx, std::span<const uint8_t> payload, const KVView& out,
                                     std::vector<float>& scratch) const;
};

// The codec registry: by name (CodecConfig::codec) and by stored id.
Result<const Codec*> CodecByName(std::string_view name);
Result<const Codec*> CodecById(uint8_t id);
// The codec of a frame with these params: CodecById, and the baselines
// (every codec but cachegen) carry no params (FORMAT.md) → corrupt.
Result<const Codec*> FrameCodec(uint8_t id, std::span<const uint8_t> params);

// Factories, one per codec's .cc file; the registry (registry.cc) lists them
// explicitly so that static linking cannot drop a codec.
std::unique_ptr<Codec> MakeFp16Codec();
std::unique_ptr<Codec> MakeFp16ZstdCodec();
std::unique_ptr<Codec> MakeQ8Codec();
std::unique_ptr<Codec> MakeQ4Codec();
std::unique_ptr<Codec> MakeKivi2Codec();
std::unique_ptr<Codec> MakeKivi4Codec();
std::unique_ptr<Codec> MakeCacheGenRefCodec();
std::unique_ptr<Codec> MakeCacheGenCodec();

}  // namespace cachegen
