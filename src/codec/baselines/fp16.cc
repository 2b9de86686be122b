// fp16: raw IEEE half, the reference point every ratio is measured against.
// Payload: tokens * channels little-endian binary16 values, row-major.
#include <bit>
#include <cstring>

#include "codec/baselines/baseline_util.h"
#include "codec/codec.h"
#include "common/half.h"

namespace cachegen {
namespace {

class Fp16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp16; }
  std::string_view name() const override { return "fp16"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig&) const override {
    EncodedLevel level;
    for (uint32_t l = 0; l < chunk.shape.layers; ++l)
      for (KV kv : {KV::kKey, KV::kValue}) {
        auto in = chunk.Section(l, kv);
        CG_RETURN_IF_ERROR(baseline::CheckFiniteSection(in, "fp16"));
        EncodedSection s;
        s.bytes.resize(in.size() * 2);
        for (size_t i = 0; i < in.size(); ++i) {
          const uint16_t h = F32ToF16(in[i]);
          std::memcpy(&s.bytes[2 * i], &h, 2);
        }
        level.sections.push_back(std::move(s));
      }
    std::vector<EncodedLevel> out;
    out.push_back(std::move(level));
    return out;
  }

  Status DecodeSection(const SectionContext&, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    if (payload.size() != out.size() * 2)
      return Status::Corrupt("fp16 section has " + std::to_string(payload.size()) + " bytes, expected " +
                             std::to_string(out.size() * 2));
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, &payload[2 * i], 2);
      out[i] = F16ToF32(h);
    }
    return Status::Ok();
  }

  // An f16 destination with contiguous rows takes the payload's bytes as
  // they are (what a raw slot restore does): no round trip through f32.
  Status DecodeSectionToView(const SectionContext& ctx, std::span<const uint8_t> payload, const KVView& out,
                             std::vector<float>& scratch) const override {
    const uint64_t row = ctx.shape.channels();
    const bool raw = std::endian::native == std::endian::little && out.dtype() == DType::kF16 &&
                     out.strides().dim == 1 &&
                     (ctx.shape.kv_heads == 1 || out.strides().head == int64_t{ctx.shape.head_dim});
    if (!raw) return Codec::DecodeSectionToView(ctx, payload, out, scratch);
    if (payload.size() != uint64_t{ctx.shape.tokens} * row * 2)
      return Status::Corrupt("fp16 section has " + std::to_string(payload.size()) + " bytes, expected " +
                             std::to_string(uint64_t{ctx.shape.tokens} * row * 2));
    for (uint32_t t = 0; t < ctx.shape.tokens; ++t)
      std::memcpy(out.Pointer(ctx.layer, ctx.kv, t, 0, 0), payload.data() + t * row * 2, row * 2);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Codec> MakeFp16Codec() { return std::make_unique<Fp16Codec>(); }

}  // namespace cachegen
