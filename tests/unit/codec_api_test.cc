// Encoder/Decoder glue: config validation, chunking, stats, dtypes, strided
// views, token_start, and frame-level decoding, using the fp16 codec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cachegen/codec.h"
#include "format/frame.h"

namespace cachegen {
namespace {

KVTensor RandomTensor(KVShape shape, uint32_t seed) {
  KVTensor t(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto* p = reinterpret_cast<float*>(t.data());
  for (uint64_t i = 0; i < shape.values(); ++i) p[i] = n(rng);
  return t;
}

double MaxAbsDiff(const KVView& a, const KVView& b) {
  double m = 0;
  const KVShape& s = a.shape();
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d)
            m = std::max(m, double(std::fabs(a.Get(l, kv, t, h, d) - b.Get(l, kv, t, h, d))));
  return m;
}

CodecConfig Fp16(uint32_t chunk_tokens = 16) {
  CodecConfig c;
  c.codec = "fp16";
  c.chunk_tokens = chunk_tokens;
  c.threads = 2;
  return c;
}

TEST(Encoder, ConfigValidation) {
  EXPECT_TRUE(Encoder::Create(Fp16()).ok());
  CodecConfig c = Fp16();
  c.codec = "nope";
  EXPECT_EQ(Encoder::Create(c).status().code(), StatusCode::kInvalidArgument);
  c = Fp16();
  c.bits_per_value = 2;
  c.snr_db = 20;
  EXPECT_EQ(Encoder::Create(c).status().code(), StatusCode::kInvalidArgument);
  c = Fp16();
  c.max_rel_error = -1;
  EXPECT_FALSE(Encoder::Create(c).ok());
  c = Fp16();
  c.bits_per_value = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(Encoder::Create(c).ok());
  for (uint32_t levels : {0u, 9u}) {
    c = Fp16();
    c.levels = levels;
    EXPECT_FALSE(Encoder::Create(c).ok()) << levels;
  }
  c = Fp16();
  c.level_bits = std::vector<double>(9, 1.0);
  EXPECT_FALSE(Encoder::Create(c).ok());
  c = Fp16();
  c.level_bits = {2.0, 0.0};
  EXPECT_FALSE(Encoder::Create(c).ok());
  c = Fp16();
  c.snr_db = 30;
  EXPECT_TRUE(Encoder::Create(c).ok());
}

TEST(Encoder, RejectsNonFinite) {
  KVTensor t = RandomTensor({1, 1, 4, 8}, 3);
  reinterpret_cast<float*>(t.data())[13] = std::numeric_limits<float>::infinity();
  auto enc = Encoder::Create(Fp16());
  auto r = enc->Encode(t.view());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// fp16 and fp16-zstd would store a value beyond the f16 range as infinity.
TEST(Encoder, Fp16CodecsRejectValuesBeyondF16) {
  KVTensor t = RandomTensor({1, 1, 4, 8}, 3);
  reinterpret_cast<float*>(t.data())[13] = 1e6f;
  for (const char* codec : {"fp16", "fp16-zstd"}) {
    CodecConfig c = Fp16();
    c.codec = codec;
    EXPECT_EQ(Encoder::Create(c)->Encode(t.view()).status().code(), StatusCode::kInvalidArgument) << codec;
  }
}

// A baseline frame carries no codec params: one that does is corrupt.
TEST(Decoder, BaselineFrameWithParamsIsCorrupt) {
  const KVTensor t = RandomTensor({1, 1, 4, 8}, 3);
  auto frames = Encoder::Create(Fp16())->EncodeChunk(t.view(), 0, 0);
  ASSERT_TRUE(frames.ok()) << frames.status().ToString();
  KVTensor out(t.shape(), DType::kF32);
  ASSERT_TRUE(DecodeFrame(frames->at(0), out.view()).ok());
  auto parsed = ParseFrame(frames->at(0));
  ASSERT_TRUE(parsed.ok());
  FrameHeader h = parsed->header;
  h.params = {1};
  std::vector<EncodedSection> sections;
  for (KV kv : {KV::kKey, KV::kValue}) {
    auto payload = SectionPayload(*parsed, frames->at(0), 0, kv);
    ASSERT_TRUE(payload.ok());
    sections.push_back({std::vector<uint8_t>(payload->begin(), payload->end())});
  }
  const std::vector<uint8_t> with_params = WriteFrame(h, sections);
  EXPECT_EQ(DecodeFrame(with_params, out.view()).code(), StatusCode::kCorrupt);
  EXPECT_EQ(InspectFrame(with_params).status().code(), StatusCode::kCorrupt);
}

TEST(Encoder, RoundTripChunksAndStats) {
  const KVShape shape{3, 2, 8, 40};
  const KVTensor in = RandomTensor(shape, 4);
  CodecConfig cfg = Fp16(16);
  cfg.levels = 3;  // fp16 is fixed-rate: the container gets one level
  auto enc = Encoder::Create(cfg);
  ASSERT_TRUE(enc.ok());
  EncodeStats stats;
  auto bytes = enc->Encode(in.view(), &stats, 100);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(stats.container_bytes, bytes->size());
  EXPECT_EQ(stats.input_values, shape.values());
  ASSERT_EQ(stats.frames.size(), 3u);
  ASSERT_EQ(stats.level_bits_per_value.size(), 1u);
  EXPECT_GT(stats.level_bits_per_value[0], 16.0);
  EXPECT_LT(stats.level_bits_per_value[0], 18.0);  // headers weigh on a tiny tensor
  uint64_t sum = 0;
  for (const FrameStats& f : stats.frames) {
    sum += f.bytes;
    ASSERT_EQ(f.layer_bits_k.size(), 3u);
    EXPECT_DOUBLE_EQ(f.layer_bits_k[0], 16.0);
    EXPECT_DOUBLE_EQ(f.layer_bits_v[2], 16.0);
  }
  EXPECT_EQ(stats.frames[2].chunk, 2u);
  EXPECT_EQ(stats.frames[2].token_start, 132u);
  EXPECT_EQ(stats.frames[2].tokens, 8u);
  EXPECT_NEAR(stats.level_bits_per_value[0], double(bytes->size()) * 8 / double(shape.values()), 1e-9);
  EXPECT_LT(sum, bytes->size());

  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->info().shape, shape);
  EXPECT_EQ(dec->info().token_start, 100u);
  EXPECT_EQ(dec->info().levels, 1u);
  EXPECT_EQ(dec->info().codec, "fp16");
  EXPECT_EQ(dec->info().dtype, DType::kF32);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto out = dec->Decode(dt, 0, 3);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_LT(MaxAbsDiff(in.view(), out->view()), dt == DType::kBF16 ? 0.05 : 0.005);
  }
  EXPECT_EQ(dec->Decode(DType::kF32, 1).status().code(), StatusCode::kInvalidArgument);
  KVTensor wrong({3, 2, 8, 39}, DType::kF32);
  EXPECT_EQ(dec->Decode(wrong.view()).code(), StatusCode::kInvalidArgument);

  // Frames decode standalone and report their facts.
  auto frame = dec->Frame(1, 0);
  ASSERT_TRUE(frame.ok());
  auto fi = InspectFrame(*frame);
  ASSERT_TRUE(fi.ok());
  EXPECT_EQ(fi->codec, "fp16");
  EXPECT_EQ(fi->shape, (KVShape{3, 2, 8, 16}));
  EXPECT_EQ(fi->token_start, 116u);
  EXPECT_EQ(fi->context_tokens, 140u);
  EXPECT_EQ(fi->layer_bytes_k.size(), 3u);
  EXPECT_EQ(fi->layer_bytes_v[1], 16u * 16 * 2);
  const KVTensor want = in.Slice(16, 16);
  KVTensor got(fi->shape, DType::kF32);
  ASSERT_TRUE(DecodeFrame(*frame, got.view(), 4).ok());
  EXPECT_LT(MaxAbsDiff(want.view(), got.view()), 0.005);
  KVTensor layer(fi->shape, DType::kF32);
  ASSERT_TRUE(DecodeFrameLayer(*frame, 2, layer.view()).ok());
  EXPECT_FLOAT_EQ(layer.view().Get(2, KV::kValue, 3, 1, 5), got.view().Get(2, KV::kValue, 3, 1, 5));
  EXPECT_EQ(layer.view().Get(0, KV::kKey, 3, 1, 5), 0.0f);
  EXPECT_FALSE(DecodeFrameLayer(*frame, 3, layer.view()).ok());
  EXPECT_EQ(DecodeFrame(*frame, wrong.view()).code(), StatusCode::kInvalidArgument);
}

TEST(Encoder, WholeContextChunkAndStridedView) {
  const KVShape shape{2, 2, 4, 10};
  const KVTensor in = RandomTensor(shape, 5);
  // A token-major engine layout: [token][layer][K|V][head][dim].
  std::vector<float> engine(shape.values());
  KVStrides st;
  st.dim = 1;
  st.head = 4;
  st.kv = 8;
  st.layer = 16;
  st.token = 32;
  KVView view(engine.data(), DType::kF32, shape, st);
  ASSERT_TRUE(CopyKV(in.view(), view).ok());
  auto enc = Encoder::Create(Fp16(0));
  EncodeStats stats;
  auto bytes = enc->Encode(view, &stats);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(stats.frames.size(), 1u);
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(dec->info().chunks.size(), 1u);
  EXPECT_EQ(dec->info().chunk_tokens, 10u);
  std::vector<float> back(shape.values());
  KVView out(back.data(), DType::kF32, shape, st);
  ASSERT_TRUE(dec->Decode(out).ok());
  EXPECT_LT(MaxAbsDiff(in.view(), out), 0.005);
}

// fp16 of an f16 tensor is lossless into every layout: contiguous f16 (the
// byte-copy path), token-major f16 (strided) and f32.
TEST(Encoder, Fp16OfF16IsExactInEveryLayout) {
  const KVShape shape{2, 2, 4, 10};
  const KVTensor in = RandomTensor(shape, 9).Converted(DType::kF16);
  auto bytes = Encoder::Create(Fp16(4))->Encode(in.view());
  ASSERT_TRUE(bytes.ok());
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  KVTensor same(shape, DType::kF16);
  ASSERT_TRUE(dec->Decode(same.view()).ok());
  EXPECT_EQ(std::memcmp(same.data(), in.data(), in.size_bytes()), 0);
  std::vector<uint16_t> engine(shape.values());
  KVStrides st;
  st.dim = 1;
  st.head = 4;
  st.kv = 8;
  st.layer = 16;
  st.token = 32;
  KVView token_major(engine.data(), DType::kF16, shape, st);
  ASSERT_TRUE(dec->Decode(token_major).ok());
  EXPECT_EQ(MaxAbsDiff(in.view(), token_major), 0.0);
  KVTensor f32(shape, DType::kF32);
  ASSERT_TRUE(dec->Decode(f32.view()).ok());
  EXPECT_EQ(MaxAbsDiff(in.view(), f32.view()), 0.0);
}

TEST(Encoder, EncodeChunkFrames) {
  const KVShape shape{1, 1, 8, 5};
  const KVTensor in = RandomTensor(shape, 6);
  auto enc = Encoder::Create(Fp16());
  std::vector<FrameStats> stats;
  auto frames = enc->EncodeChunk(in.view(), 50, 0, &stats);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 1u);
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].bytes, (*frames)[0].size());
  auto fi = InspectFrame((*frames)[0]);
  ASSERT_TRUE(fi.ok());
  EXPECT_EQ(fi->context_tokens, 55u);
  EXPECT_FALSE(enc->EncodeChunk(in.view(), 50, 54).ok());
}

}  // namespace
}  // namespace cachegen

namespace cachegen {
namespace {

// Decoded KV is allocated only up to the decode bound: all-zero KV, the most
// compressible input, decodes within the default; a bound below the claim
// is refused before anything is allocated.
TEST(Decoder, RefusesAContainerThatClaimsMoreThanTheDecodeBound) {
  EXPECT_EQ(DecodeOutputLimit(0), 64ull << 20);
  EXPECT_EQ(DecodeOutputLimit(1000), 1024000 + (64ull << 20));
  EXPECT_EQ(DecodeOutputLimit(UINT64_MAX), UINT64_MAX);
  KVTensor zeros(KVShape{2, 2, 64, 1024}, DType::kF16);  // zero-filled
  CodecConfig cfg;
  cfg.chunk_tokens = 1024;
  auto enc = Encoder::Create(cfg);
  ASSERT_TRUE(enc.ok());
  auto bytes = enc->Encode(zeros.view());
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto dec = Decoder::Open(*bytes);
  ASSERT_TRUE(dec.ok());
  const uint64_t want = zeros.shape().values() * 2;
  EXPECT_GT(want, 100 * bytes->size()) << "zeros compress far";
  EXPECT_TRUE(dec->Decode(DType::kF16).ok());
  EXPECT_TRUE(dec->Decode(DType::kF16, 0, 1, want).ok());
  auto refused = dec->Decode(DType::kF16, 0, 1, want - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("decode limit"), std::string::npos) << refused.status().ToString();
}

}  // namespace
}  // namespace cachegen
