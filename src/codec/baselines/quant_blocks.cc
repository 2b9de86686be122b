// q8 and q4: llama.cpp q8_0 / q4_0-style block quantization, the standard
// "just quantize it" baselines.
//
// Both split each token row (channels values of one (layer, K|V, token)) into
// blocks of 32 consecutive channels; when channels % 32 != 0 the last block of
// each row is shorter (channels % 32 values). Each block stores an f16 scale d
// followed by its codes. Rows follow each other in token order; there is no
// other framing, so the payload size is a function of (tokens, channels) only.
//
// q8 block: d (f16), then n int8 codes q; x' = q * d.
//   d = max|x| / 127 rounded *up* to f16 (so |x| / d <= 127), q = round-half-
//   even(x / d) in [-127, 127]. Error <= d / 2.
// q4 block: d (f16), then ceil(n / 2) bytes; code j is in byte j / 2, low
//   nibble for even j, high nibble for odd j (a zero high nibble pads an odd
//   n). q in [0, 15], x' = (q - 8) * d.
//   As q4_0: m = the value of largest magnitude (signed, first one on ties),
//   d = m / -8 (to f16, rounded away from zero so |x / d| <= 8), q =
//   min(15, floor(x / d + 8.5)) clamped to [0, 15]. m itself maps to q = 0,
//   exact up to the f16 rounding of d. Error <= |d| / 2, except values near
//   -m (x / d > 7.5) which clamp to q = 15: error <= |d|.
//   (q4_0 interleaves codes j and j+16 in one byte, a SIMD layout choice; we
//   pack consecutive codes, which also works for short blocks.)
//
// Bits per value, channels % 32 == 0: q8 (16 + 32 * 8) / 32 = 8.5,
// q4 (16 + 32 * 4) / 32 = 4.5. Side information: the scales.
#include <algorithm>
#include <cmath>

#include "codec/baselines/baseline_util.h"

namespace cachegen {
namespace {

constexpr uint32_t kBlock = 32;

uint64_t BlocksPerRow(uint64_t channels) { return (channels + kBlock - 1) / kBlock; }

// Payload bytes of one section; bits = 8 or 4.
uint64_t SectionBytes(uint64_t tokens, uint64_t channels, uint32_t bits) {
  uint64_t row = BlocksPerRow(channels) * 2;
  if (bits == 8) {
    row += channels;
  } else {
    const uint64_t full = channels / kBlock, tail = channels % kBlock;
    row += full * (kBlock / 2) + (tail + 1) / 2;
  }
  return tokens * row;
}

class BlockQuantCodec final : public Codec {
 public:
  explicit BlockQuantCodec(uint32_t bits) : bits_(bits) {}
  CodecId id() const override { return bits_ == 8 ? CodecId::kQ8 : CodecId::kQ4; }
  std::string_view name() const override { return bits_ == 8 ? "q8" : "q4"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig&) const override {
    const uint32_t tokens = chunk.shape.tokens;
    const uint64_t channels = chunk.shape.channels();
    const char* nm = bits_ == 8 ? "q8" : "q4";
    return baseline::EncodeEachSection(
        chunk, [&](uint32_t, KV, std::span<const float> in, EncodedSection& s) -> Status {
          CG_RETURN_IF_ERROR(baseline::CheckFiniteSection(in, nm));
          s.bytes.reserve(SectionBytes(tokens, channels, bits_));
          for (uint32_t t = 0; t < tokens; ++t) {
            const float* row = in.data() + uint64_t{t} * channels;
            for (uint64_t b0 = 0; b0 < channels; b0 += kBlock) {
              const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(kBlock, channels - b0));
              if (bits_ == 8)
                EncodeQ8Block(row + b0, n, s.bytes);
              else
                EncodeQ4Block(row + b0, n, s.bytes);
            }
          }
          s.side_bytes = static_cast<uint32_t>(tokens * BlocksPerRow(channels) * 2);
          return Status::Ok();
        });
  }

  Status DecodeSection(const SectionContext& ctx, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    const uint64_t channels = ctx.shape.channels();
    if (channels == 0 || out.size() % channels != 0)
      return Status::InvalidArgument("q8/q4: output size is not a whole number of rows");
    const uint64_t tokens = out.size() / channels;
    const uint64_t want = SectionBytes(tokens, channels, bits_);
    if (payload.size() != want) return baseline::SizeMismatch(bits_ == 8 ? "q8" : "q4", payload.size(), want);
    const uint8_t* p = payload.data();
    float* o = out.data();
    for (uint64_t t = 0; t < tokens; ++t)
      for (uint64_t b0 = 0; b0 < channels; b0 += kBlock) {
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(kBlock, channels - b0));
        const float d = F16ToF32(baseline::GetF16(p));
        p += 2;
        if (bits_ == 8) {
          for (uint32_t j = 0; j < n; ++j) *o++ = static_cast<float>(static_cast<int8_t>(p[j])) * d;
          p += n;
        } else {
          for (uint32_t j = 0; j < n; ++j) {
            const uint32_t q = (p[j / 2] >> ((j & 1) * 4)) & 0xfu;
            *o++ = (static_cast<float>(q) - 8.0f) * d;
          }
          p += (n + 1) / 2;
        }
      }
    return Status::Ok();
  }

 private:
  static void EncodeQ8Block(const float* x, uint32_t n, std::vector<uint8_t>& out) {
    float amax = 0;
    for (uint32_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
    const uint16_t dh = baseline::F16CeilNonNeg(amax / 127.0f);
    const float d = F16ToF32(dh);
    baseline::PutF16(out, dh);
    for (uint32_t j = 0; j < n; ++j) {
      const float q = d > 0 ? std::nearbyint(x[j] / d) : 0.0f;
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
    }
  }

  static void EncodeQ4Block(const float* x, uint32_t n, std::vector<uint8_t>& out) {
    float amax = 0, m = 0;
    for (uint32_t j = 0; j < n; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        m = x[j];
      }
    // |d| rounded up so that |x / d| <= 8 for every x of the block.
    uint16_t dh = baseline::F16CeilNonNeg(amax / 8.0f);
    if (m > 0) dh |= 0x8000u;  // d = m / -8 has the opposite sign of m
    const float d = F16ToF32(dh);
    baseline::PutF16(out, dh);
    uint8_t pending = 0;
    for (uint32_t j = 0; j < n; ++j) {
      const float v = d != 0 ? std::floor(x[j] / d + 8.5f) : 8.0f;
      const uint8_t q = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
      if ((j & 1) == 0) {
        pending = q;
      } else {
        out.push_back(static_cast<uint8_t>(pending | (q << 4)));
      }
    }
    if (n & 1) out.push_back(pending);
  }

  uint32_t bits_;
};

}  // namespace

std::unique_ptr<Codec> MakeQ8Codec() { return std::make_unique<BlockQuantCodec>(8); }
std::unique_ptr<Codec> MakeQ4Codec() { return std::make_unique<BlockQuantCodec>(4); }

}  // namespace cachegen
