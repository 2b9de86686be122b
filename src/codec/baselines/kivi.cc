// kivi2 / kivi4: KIVI (Liu et al., 2024) asymmetric quantization, b = 2 or 4.
//
// Keys are quantized per channel over groups of 32 tokens, values per token
// over groups of 32 channels; each group stores an f16 minimum and an f16
// step. The most recent 128 tokens of the context (absolute position p >=
// context_tokens - 128) stay in f16, as KIVI keeps its sliding window in full
// precision.
//
// Token groups of keys start at the chunk's first token. Non-recent tokens of
// the chunk are [0, r) with r = clamp(context_tokens - 128 - token_start, 0,
// tokens) (recent tokens are always a suffix of a chunk). Keys of the
// incomplete trailing group — tokens [32 * floor(r / 32), r) — are stored in
// f16 too: KIVI keeps that residual in full precision until a group fills.
// Values have no such residual: a short last channel group (channels % 32
// values) is quantized like the others.
//
// Quantizer of one group (n values, L = 2^b - 1):
//   mn = min rounded *down* to f16, s = (max - mn) / L rounded *up* to f16,
//   q = clamp(round-half-even((x - mn) / s), 0, L) (q = 0 when s = 0),
//   x' = q * s + mn.  Error <= s / 2 (up to float rounding).
//
// Section payload, in order (all f16 little-endian):
//   1. group parameters (side information), (min, step) pairs:
//        keys:   for g in [0, r / 32), for c in [0, channels)
//        values: for t in [0, r), for channel group j in [0, ceil(channels / 32))
//   2. codes, b bits each, packed densely LSB-first into one bit string,
//      zero-padded to a whole byte:
//        keys:   for g, for c, for the 32 tokens of g in order
//        values: for t, for c in [0, channels)
//   3. f16 rows, token-major, for tokens [k, tokens) where k = 32 * floor(r /
//      32) for keys and k = r for values.
// The payload size is a function of (tokens, channels, r, b) and is checked
// exactly.
//
// Bits per value without recent tokens, tokens % 32 == 0 and channels % 32 ==
// 0: b + 32 / 32 = b + 1 (3 for kivi2, 5 for kivi4), keys and values alike.
#include <algorithm>
#include <cmath>

#include "codec/baselines/baseline_util.h"

namespace cachegen {
namespace {

constexpr uint32_t kGroup = 32;
constexpr uint32_t kRecent = 128;

// Number of leading non-recent tokens of a chunk.
uint32_t NonRecent(uint32_t tokens, uint32_t token_start, uint32_t context_tokens) {
  const int64_t r = int64_t{context_tokens} - kRecent - int64_t{token_start};
  return static_cast<uint32_t>(std::clamp<int64_t>(r, 0, tokens));
}

struct Layout {
  uint64_t params = 0;  // (min, step) pairs
  uint64_t codes = 0;
  uint64_t f16_rows_from = 0;
  uint64_t f16_values = 0;
  uint64_t code_bytes(uint32_t bits) const { return (codes * bits + 7) / 8; }
  uint64_t bytes(uint32_t bits) const { return params * 4 + code_bytes(bits) + f16_values * 2; }
};

Layout MakeLayout(KV kv, uint64_t tokens, uint64_t channels, uint64_t r) {
  Layout lo;
  if (kv == KV::kKey) {
    const uint64_t groups = r / kGroup;
    lo.params = groups * channels;
    lo.codes = groups * kGroup * channels;
    lo.f16_rows_from = groups * kGroup;
  } else {
    lo.params = r * ((channels + kGroup - 1) / kGroup);
    lo.codes = r * channels;
    lo.f16_rows_from = r;
  }
  lo.f16_values = (tokens - lo.f16_rows_from) * channels;
  return lo;
}

struct GroupQuant {
  float mn, s;
  uint16_t mn_h, s_h;
};

GroupQuant FitGroup(float lo, float hi, uint32_t levels) {
  GroupQuant g;
  g.mn_h = baseline::F16Floor(lo);
  g.mn = F16ToF32(g.mn_h);
  g.s_h = baseline::F16CeilNonNeg((hi - g.mn) / static_cast<float>(levels));
  g.s = F16ToF32(g.s_h);
  return g;
}

uint32_t QuantizeOne(float x, const GroupQuant& g, uint32_t levels) {
  if (g.s <= 0) return 0;
  const float q = std::nearbyint((x - g.mn) / g.s);
  return static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>(levels)));
}

class KiviCodec final : public Codec {
 public:
  explicit KiviCodec(uint32_t bits) : bits_(bits), levels_((1u << bits) - 1) {}
  CodecId id() const override { return bits_ == 2 ? CodecId::kKivi2 : CodecId::kKivi4; }
  std::string_view name() const override { return bits_ == 2 ? "kivi2" : "kivi4"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig&) const override {
    const uint32_t tokens = chunk.shape.tokens;
    const uint64_t C = chunk.shape.channels();
    const uint32_t r = NonRecent(tokens, chunk.token_start, chunk.context_tokens);
    const char* nm = bits_ == 2 ? "kivi2" : "kivi4";
    return baseline::EncodeEachSection(
        chunk, [&](uint32_t, KV kv, std::span<const float> in, EncodedSection& s) -> Status {
          CG_RETURN_IF_ERROR(baseline::CheckFiniteSection(in, nm));
          const Layout lo = MakeLayout(kv, tokens, C, r);
          std::vector<uint8_t> params, codes;
          params.reserve(lo.params * 4);
          codes.reserve(lo.code_bytes(bits_));
          baseline::BitPacker pack(&codes);
          if (kv == KV::kKey) {
            const uint64_t groups = r / kGroup;
            for (uint64_t g = 0; g < groups; ++g)
              for (uint64_t c = 0; c < C; ++c) {
                const float* col = in.data() + g * kGroup * C + c;
                float lo_v = col[0], hi_v = col[0];
                for (uint32_t t = 1; t < kGroup; ++t) {
                  lo_v = std::min(lo_v, col[t * C]);
                  hi_v = std::max(hi_v, col[t * C]);
                }
                const GroupQuant q = FitGroup(lo_v, hi_v, levels_);
                baseline::PutF16(params, q.mn_h);
                baseline::PutF16(params, q.s_h);
                for (uint32_t t = 0; t < kGroup; ++t) pack.Put(QuantizeOne(col[t * C], q, levels_), bits_);
              }
          } else {
            for (uint64_t t = 0; t < r; ++t)
              for (uint64_t c0 = 0; c0 < C; c0 += kGroup) {
                const float* x = in.data() + t * C + c0;
                const uint64_t n = std::min<uint64_t>(kGroup, C - c0);
                float lo_v = x[0], hi_v = x[0];
                for (uint64_t j = 1; j < n; ++j) {
                  lo_v = std::min(lo_v, x[j]);
                  hi_v = std::max(hi_v, x[j]);
                }
                const GroupQuant q = FitGroup(lo_v, hi_v, levels_);
                baseline::PutF16(params, q.mn_h);
                baseline::PutF16(params, q.s_h);
                for (uint64_t j = 0; j < n; ++j) pack.Put(QuantizeOne(x[j], q, levels_), bits_);
              }
          }
          pack.Flush();
          s.bytes = std::move(params);
          s.side_bytes = static_cast<uint32_t>(s.bytes.size());
          s.bytes.insert(s.bytes.end(), codes.begin(), codes.end());
          for (uint64_t i = lo.f16_rows_from * C; i < in.size(); ++i) baseline::PutF16(s.bytes, F32ToF16(in[i]));
          return Status::Ok();
        });
  }

  Status DecodeSection(const SectionContext& ctx, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    const uint64_t C = ctx.shape.channels();
    if (C == 0 || out.size() % C != 0) return Status::InvalidArgument("kivi: output is not a whole number of rows");
    const uint64_t tokens = out.size() / C;
    if (tokens > UINT32_MAX) return Status::InvalidArgument("kivi: too many tokens");
    const uint32_t r = NonRecent(static_cast<uint32_t>(tokens), ctx.token_start, ctx.context_tokens);
    const Layout lo = MakeLayout(ctx.kv, tokens, C, r);
    const uint64_t want = lo.bytes(bits_);
    if (payload.size() != want) return baseline::SizeMismatch(bits_ == 2 ? "kivi2" : "kivi4", payload.size(), want);
    const uint8_t* params = payload.data();
    baseline::BitUnpacker codes(payload.subspan(lo.params * 4, lo.code_bytes(bits_)));
    const uint8_t* rows = payload.data() + lo.params * 4 + lo.code_bytes(bits_);
    auto param = [&](uint64_t i, float& mn, float& s) {
      mn = F16ToF32(baseline::GetF16(params + 4 * i));
      s = F16ToF32(baseline::GetF16(params + 4 * i + 2));
    };
    if (ctx.kv == KV::kKey) {
      const uint64_t groups = r / kGroup;
      for (uint64_t g = 0; g < groups; ++g)
        for (uint64_t c = 0; c < C; ++c) {
          float mn, s;
          param(g * C + c, mn, s);
          float* col = out.data() + g * kGroup * C + c;
          for (uint32_t t = 0; t < kGroup; ++t) col[t * C] = static_cast<float>(codes.Get(bits_)) * s + mn;
        }
    } else {
      const uint64_t per_row = (C + kGroup - 1) / kGroup;
      for (uint64_t t = 0; t < r; ++t)
        for (uint64_t j = 0; j < per_row; ++j) {
          float mn, s;
          param(t * per_row + j, mn, s);
          float* x = out.data() + t * C + j * kGroup;
          const uint64_t n = std::min<uint64_t>(kGroup, C - j * kGroup);
          for (uint64_t i = 0; i < n; ++i) x[i] = static_cast<float>(codes.Get(bits_)) * s + mn;
        }
    }
    for (uint64_t i = 0; i < lo.f16_values; ++i)
      out[lo.f16_rows_from * C + i] = F16ToF32(baseline::GetF16(rows + 2 * i));
    return Status::Ok();
  }

 private:
  uint32_t bits_;
  uint32_t levels_;
};

}  // namespace

std::unique_ptr<Codec> MakeKivi2Codec() { return std::make_unique<KiviCodec>(2); }
std::unique_ptr<Codec> MakeKivi4Codec() { return std::make_unique<KiviCodec>(4); }

}  // namespace cachegen
