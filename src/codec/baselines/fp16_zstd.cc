// fp16-zstd: zstd (level 3) over the section's raw f16 bytes — what a generic
// compressor gets out of a KV cache with no modelling at all.
//
// Payload: exactly one zstd frame, with its content size recorded, whose
// content is the fp16 codec's payload (tokens * channels little-endian
// binary16 values, row-major). No side information.
#include <zstd.h>

#include "codec/baselines/baseline_util.h"

namespace cachegen {
namespace {

constexpr int kZstdLevel = 3;

class Fp16ZstdCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp16Zstd; }
  std::string_view name() const override { return "fp16-zstd"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig&) const override {
    std::vector<uint8_t> raw;
    return baseline::EncodeEachSection(
        chunk, [&](uint32_t, KV, std::span<const float> in, EncodedSection& s) -> Status {
          CG_RETURN_IF_ERROR(baseline::CheckFiniteSection(in, "fp16-zstd"));
          raw.clear();
          raw.reserve(in.size() * 2);
          for (float x : in) baseline::PutF16(raw, F32ToF16(x));
          s.bytes.resize(ZSTD_compressBound(raw.size()));
          const size_t n = ZSTD_compress(s.bytes.data(), s.bytes.size(), raw.data(), raw.size(), kZstdLevel);
          if (ZSTD_isError(n)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(n));
          s.bytes.resize(n);
          return Status::Ok();
        });
  }

  Status DecodeSection(const SectionContext&, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    const uint64_t expected = uint64_t{out.size()} * 2;
    // The frame must declare exactly the expected content size and span the
    // whole payload: no trailing bytes, no second frame, no unknown size.
    const unsigned long long content = ZSTD_getFrameContentSize(payload.data(), payload.size());
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
      return Status::Corrupt("fp16-zstd section is not a zstd frame with a known content size");
    if (content != expected)
      return Status::Corrupt("fp16-zstd section holds " + std::to_string(content) + " bytes, expected " +
                             std::to_string(expected));
    const size_t frame = ZSTD_findFrameCompressedSize(payload.data(), payload.size());
    if (ZSTD_isError(frame) || frame != payload.size())
      return Status::Corrupt("fp16-zstd section has trailing bytes or a truncated frame");
    std::vector<uint8_t> raw(expected);
    const size_t n = ZSTD_decompress(raw.data(), raw.size(), payload.data(), payload.size());
    if (ZSTD_isError(n)) return Status::Corrupt(std::string("fp16-zstd: ") + ZSTD_getErrorName(n));
    if (n != expected) return baseline::SizeMismatch("fp16-zstd decompressed", n, expected);
    for (size_t i = 0; i < out.size(); ++i) out[i] = F16ToF32(baseline::GetF16(&raw[2 * i]));
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Codec> MakeFp16ZstdCodec() { return std::make_unique<Fp16ZstdCodec>(); }

}  // namespace cachegen
