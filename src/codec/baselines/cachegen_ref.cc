// cachegen-ref: the published CacheGen quantizer as configured in LMCache,
// with per-channel entropy coding — the paper's own operating point, to
// compare the product codec against.
//
// Per token row (one (layer, K|V, token), all channels): a symmetric max-abs
// scale a = max|x| (f16, rounded up), and B bins where
//   keys:   B = 32 for layers 0..9,  16 for layers >= 10
//   values: B = 32 for layers 0..1,  16 for layers >= 2.
// Bins as LMCache's quantizer: M = B / 2 - 1 (15 or 7), q = round-half-even(x
// / a * M) in [-M, M] (2M + 1 levels uniformly spanning [-1, 1]); x' = q / M *
// a. Error <= a / (2M). Symbol = q + M, in [0, 2M].
//
// Symbols are entropy coded with rANS, one stream per channel over the
// chunk's tokens, so each (layer, K|V, channel) gets its own distribution, as
// CacheGen's per-channel-per-layer arithmetic coding. Streams are single-lane:
// they are short (one chunk's tokens) and each extra lane costs flush bytes.
//
// Section payload:
//   tokens f16 scales a (token order), then `channels` rANS symbol streams
//   (docs/FORMAT.md, "Symbol streams"), channel 0 first, each coding that
//   channel's `tokens` symbols in token order. Nothing may follow the last
//   stream; every symbol must be <= 2M.
// side_bytes: the scales plus each stream's bytes beyond its ideal
// (empirical-entropy) payload size — the frequency table and framing.
#include <algorithm>
#include <cmath>

#include "codec/baselines/baseline_util.h"
#include "codec/rans.h"
#include "common/bytes.h"

namespace cachegen {
namespace {

uint32_t Bins(uint32_t layer, KV kv) {
  if (kv == KV::kKey) return layer < 10 ? 32 : 16;
  return layer < 2 ? 32 : 16;
}

class CacheGenRefCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kCacheGenRef; }
  std::string_view name() const override { return "cachegen-ref"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig&) const override {
    const uint32_t T = chunk.shape.tokens;
    const uint64_t C = chunk.shape.channels();
    std::vector<uint32_t> sym(uint64_t{T} * C);  // channel-major
    return baseline::EncodeEachSection(
        chunk, [&](uint32_t layer, KV kv, std::span<const float> in, EncodedSection& s) -> Status {
          CG_RETURN_IF_ERROR(baseline::CheckFiniteSection(in, "cachegen-ref"));
          const int32_t M = static_cast<int32_t>(Bins(layer, kv) / 2 - 1);
          ByteWriter w(&s.bytes);
          for (uint32_t t = 0; t < T; ++t) {
            const float* row = in.data() + uint64_t{t} * C;
            float amax = 0;
            for (uint64_t c = 0; c < C; ++c) amax = std::max(amax, std::fabs(row[c]));
            const uint16_t ah = baseline::F16CeilNonNeg(amax);
            w.U16(ah);
            const float a = F16ToF32(ah);
            for (uint64_t c = 0; c < C; ++c) {
              const float q = a > 0 ? std::nearbyint(row[c] / a * static_cast<float>(M)) : 0.0f;
              const int32_t qi = static_cast<int32_t>(std::clamp(q, -float(M), float(M)));
              sym[c * T + t] = static_cast<uint32_t>(qi + M);
            }
          }
          uint64_t side = uint64_t{T} * 2;  // scales, then each stream's table and lengths
          for (uint64_t c = 0; c < C; ++c)
            side += rans::EncodeStream(std::span<const uint32_t>(&sym[c * T], T), w, rans::EncodeOptions{.lanes = 1});
          s.side_bytes = static_cast<uint32_t>(std::min<uint64_t>(side, s.bytes.size()));
          return Status::Ok();
        });
  }

  Status DecodeSection(const SectionContext& ctx, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    const uint64_t C = ctx.shape.channels();
    if (C == 0 || out.size() % C != 0)
      return Status::InvalidArgument("cachegen-ref: output is not a whole number of rows");
    const uint64_t T = out.size() / C;
    const uint32_t M = Bins(ctx.layer, ctx.kv) / 2 - 1;
    if (payload.size() < T * 2) return baseline::SizeMismatch("cachegen-ref (scales)", payload.size(), T * 2);
    ByteReader in(payload);
    auto scales = in.Bytes(T * 2);
    std::vector<uint32_t> column(T);
    for (uint64_t c = 0; c < C; ++c) {
      CG_RETURN_IF_ERROR(rans::DecodeStream(in, column));
      for (uint64_t t = 0; t < T; ++t) {
        if (column[t] > 2 * M)
          return Status::Corrupt("cachegen-ref: symbol " + std::to_string(column[t]) + " out of range");
        const float a = F16ToF32(baseline::GetF16(&scales[2 * t]));
        out[t * C + c] = (static_cast<float>(column[t]) - static_cast<float>(M)) / static_cast<float>(M) * a;
      }
    }
    if (!in.ok() || in.remaining() != 0)
      return Status::Corrupt("cachegen-ref section has " + std::to_string(in.remaining()) + " trailing bytes");
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Codec> MakeCacheGenRefCodec() { return std::make_unique<CacheGenRefCodec>(); }

}  // namespace cachegen
