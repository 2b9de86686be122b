// The llama.cpp sequence-state parser/writer on hand-made blobs (no llama.cpp needed).
#include "engine/llama_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "common/bytes.h"
#include "common/half.h"
#include "kv/synthetic.h"

namespace cachegen::engine {
namespace {

KVTensor Sample(KVShape shape, DType dtype, uint64_t seed = 3) {
  auto t = SyntheticKV(shape, dtype, seed);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

bool SameValues(const KVView& a, const KVView& b) {
  if (!(a.shape() == b.shape())) return false;
  const KVShape& s = a.shape();
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d)
            if (a.Get(l, kv, t, h, d) != b.Get(l, kv, t, h, d)) return false;
  return true;
}

// A blob written independently of WriteLlamaSeqState: llama.cpp's own field order,
// f16 K rows and V either rows or transposed, with `streams` streams of which the
// last holds the cells.
std::vector<uint8_t> HandMade(const KVTensor& kv, bool v_trans, uint32_t streams, uint32_t ext_bytes) {
  const KVShape& s = kv.shape();
  const uint32_t w = static_cast<uint32_t>(s.channels());
  std::vector<uint8_t> out;
  ByteWriter b(&out);
  b.U32(0xaf143cd8u);
  b.U32(5);  // seq id
  b.U32(streams);
  for (uint32_t st = 0; st + 1 < streams; ++st) b.U32(0);
  b.U32(s.tokens);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    b.U32(100 + t);
    b.U32(1);
    for (uint32_t e = 0; e < ext_bytes; ++e) b.U8(static_cast<uint8_t>(e + t));
    b.U32(5);
  }
  b.U32(v_trans ? 1 : 0);
  b.U32(s.layers);
  auto f16 = [&](uint32_t l, KV which, uint32_t t, uint32_t c) {
    b.U16(F32ToF16(kv.view().Get(l, which, t, c / s.head_dim, c % s.head_dim)));
  };
  for (uint32_t l = 0; l < s.layers; ++l) {
    b.U32(1);
    b.U64(uint64_t{w} * 2);
    for (uint32_t t = 0; t < s.tokens; ++t)
      for (uint32_t c = 0; c < w; ++c) f16(l, KV::kKey, t, c);
  }
  for (uint32_t l = 0; l < s.layers; ++l) {
    b.U32(1);
    if (v_trans) {
      b.U32(2);
      b.U32(w);
      for (uint32_t c = 0; c < w; ++c)
        for (uint32_t t = 0; t < s.tokens; ++t) f16(l, KV::kValue, t, c);
    } else {
      b.U64(uint64_t{w} * 2);
      for (uint32_t t = 0; t < s.tokens; ++t)
        for (uint32_t c = 0; c < w; ++c) f16(l, KV::kValue, t, c);
    }
  }
  return out;
}

TEST(LlamaStateTest, ParsesHandMadeBlobsBothVLayoutsAndStreams) {
  const KVTensor kv = Sample(KVShape{3, 2, 4, 7}, DType::kF16);
  for (bool v_trans : {false, true})
    for (uint32_t streams : {1u, 3u})
      for (uint32_t ext : {0u, 12u}) {
        SCOPED_TRACE(testing::Message() << "v_trans " << v_trans << " streams " << streams << " ext " << ext);
        const auto blob = HandMade(kv, v_trans, streams, ext);
        auto st = ParseLlamaSeqState(blob, ext);
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        EXPECT_EQ(st->seq_id, 5);
        ASSERT_EQ(st->sections.size(), 1u);
        EXPECT_EQ(st->sections[0].n_stream, streams);
        ASSERT_EQ(st->sections[0].streams.size(), 1u);
        const LlamaStream& s = st->sections[0].streams[0];
        EXPECT_EQ(s.stream, streams - 1);
        EXPECT_EQ(s.cells, 7u);
        EXPECT_EQ(s.pos[3], 103);
        EXPECT_EQ(s.v_trans, v_trans);
        auto out = ExtractLlamaKV(blob, *st, 2);
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_EQ(out->dtype(), DType::kF16);
        EXPECT_TRUE(SameValues(out->view(), kv.view()));
        // Writing it back with the parsed layout gives the same bytes.
        auto layout = LayoutOf(*st);
        ASSERT_TRUE(layout.ok());
        auto again = WriteLlamaSeqState(*layout, out->view());
        ASSERT_TRUE(again.ok()) << again.status().ToString();
        EXPECT_EQ(*again, blob);
      }
}

TEST(LlamaStateTest, DetectsCellExt) {
  const KVTensor kv = Sample(KVShape{2, 1, 8, 5}, DType::kF16);
  for (uint32_t ext : {0u, 12u}) {
    auto st = ParseLlamaSeqState(HandMade(kv, false, 1, ext));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->cell_ext_bytes, ext);
  }
  // Told the wrong ext size, the blob does not parse.
  EXPECT_FALSE(ParseLlamaSeqState(HandMade(kv, false, 1, 12), 0).ok());
}

TEST(LlamaStateTest, SizeMatchesStories260KMeasurement) {
  // 5 layers, 4 KV heads x 8 dims, 200 cells, f16: 130,544 bytes as measured with llama.cpp.
  const KVTensor kv = Sample(KVShape{5, 4, 8, 200}, DType::kF16);
  auto blob = WriteLlamaSeqState(LlamaSeqLayout{}, kv.view());
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->size(), 130544u);
}

TEST(LlamaStateTest, WritesAndReadsF32AndBf16) {
  for (DType d : {DType::kF32, DType::kBF16}) {
    const KVTensor kv = Sample(KVShape{2, 2, 4, 6}, d);
    for (bool v_trans : {false, true}) {
      LlamaSeqLayout layout;
      layout.k_type = layout.v_type = GgmlOfDType(d);
      layout.v_trans = v_trans;
      layout.n_stream = 2;
      layout.stream = 1;
      layout.pos = {0, 1, 2, 10, 11, 12};
      auto blob = WriteLlamaSeqState(layout, kv.view());
      ASSERT_TRUE(blob.ok());
      auto st = ParseLlamaSeqState(*blob);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      EXPECT_EQ(st->sections[0].streams[0].pos[3], 10);
      auto out = ExtractLlamaKV(*blob, *st, 2);
      ASSERT_TRUE(out.ok());
      EXPECT_EQ(out->dtype(), d);
      EXPECT_TRUE(SameValues(out->view(), kv.view()));
    }
  }
}

TEST(LlamaStateTest, MixedKVTypesExtractAsF32) {
  const KVTensor kv = Sample(KVShape{2, 2, 4, 3}, DType::kF16);
  LlamaSeqLayout layout;
  layout.k_type = kGgmlF32;
  layout.v_type = kGgmlF16;
  auto blob = WriteLlamaSeqState(layout, kv.view());
  ASSERT_TRUE(blob.ok());
  auto st = ParseLlamaSeqState(*blob);
  ASSERT_TRUE(st.ok());
  auto out = ExtractLlamaKV(*blob, *st, 2);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->dtype(), DType::kF32);
  EXPECT_TRUE(SameValues(out->view(), kv.view()));
}

// The block layout of q8_0 (f16 scale, 32 int8), done here so that this
// test of the byte handling needs no ggml; ggml's own quantizers are tested
// in llama_ggml_quantizer_test.
class TestQ8Quantizer final : public GgmlQuantizer {
 public:
  void Dequantize(int32_t, const uint8_t* src, float* dst, size_t n) const override {
    for (size_t b = 0; b < n / 32; ++b, src += 34) {
      uint16_t h;
      std::memcpy(&h, src, 2);
      for (int j = 0; j < 32; ++j) dst[b * 32 + j] = F16ToF32(h) * static_cast<int8_t>(src[2 + j]);
    }
  }
  void Quantize(int32_t, const float* src, uint8_t* dst, size_t n) const override {
    for (size_t b = 0; b < n / 32; ++b, dst += 34) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[b * 32 + j]));
      const uint16_t h = F32ToF16(amax / 127);
      std::memcpy(dst, &h, 2);
      const float d = F16ToF32(h);
      for (int j = 0; j < 32; ++j) dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(d ? std::lround(src[b * 32 + j] / d) : 0));
    }
  }
};

TEST(LlamaStateTest, QuantizedTypesGoThroughTheQuantizer) {
  const KVTensor kv = Sample(KVShape{2, 2, 32, 3}, DType::kF32);
  const TestQ8Quantizer q8;
  LlamaSeqLayout layout;
  layout.k_type = layout.v_type = kGgmlQ8_0;
  // Without a quantizer a quantized type is refused, naming it.
  auto refused = WriteLlamaSeqState(layout, kv.view());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find("q8_0"), std::string::npos) << refused.status().message();

  auto blob = WriteLlamaSeqState(layout, kv.view(), &q8);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  // magic, seq, n_stream, cells; 3 cells x 12; v_trans, layers; 2 x 2 x (header 12 + 3 rows x 2 blocks x 34)
  EXPECT_EQ(blob->size(), 4 * 4 + 3 * 12 + 8 + 4 * (12 + 3 * 2 * 34));
  auto st = ParseLlamaSeqState(*blob, 0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->sections[0].streams[0].k_width[0], 64u);
  auto missing = ExtractLlamaKV(*blob, *st, 2);
  EXPECT_EQ(missing.status().code(), StatusCode::kUnsupported);
  auto back = ExtractLlamaKV(*blob, *st, 2, &q8);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dtype(), DType::kF32);
  EXPECT_EQ(back->shape(), kv.shape());
  const auto* x = reinterpret_cast<const float*>(kv.data());
  const auto* y = reinterpret_cast<const float*>(back->data());
  double err = 0, amax = 0;
  for (size_t i = 0; i < kv.shape().values(); ++i) {
    err = std::max(err, double(std::fabs(x[i] - y[i])));
    amax = std::max(amax, double(std::fabs(x[i])));
  }
  EXPECT_GT(err, 0.0);
  EXPECT_LE(err, amax / 127 * 0.51);  // half a step of the coarsest block
  // Written again from what was read: the same bytes.
  auto again = WriteLlamaSeqState(layout, back->view(), &q8);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *blob);

  // A quantized V cannot be transposed (llama.cpp needs flash attention for it).
  LlamaSeqLayout transposed = layout;
  transposed.v_trans = true;
  EXPECT_EQ(WriteLlamaSeqState(transposed, kv.view(), &q8).status().code(), StatusCode::kUnsupported);
  // Rows must be whole blocks.
  const KVTensor narrow = Sample(KVShape{1, 1, 16, 2}, DType::kF32);
  EXPECT_EQ(WriteLlamaSeqState(layout, narrow.view(), &q8).status().code(), StatusCode::kInvalidArgument);
}

TEST(LlamaStateTest, TypesThatAreNoCacheTypeAreRefused) {
  const KVTensor kv = Sample(KVShape{1, 1, 32, 2}, DType::kF16);
  const size_t k_type_at = 12 + 4 + 2 * 12 + 8;  // layer 0's K type
  for (uint32_t type : {12u, 99u}) {  // q3_K: a ggml type, not a cache type; 99: none
    auto blob = HandMade(kv, false, 1, 0);
    std::memcpy(blob.data() + k_type_at, &type, 4);
    auto st = ParseLlamaSeqState(blob, 0);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), type == 12 ? StatusCode::kUnsupported : StatusCode::kCorrupt) << st.status().message();
  }
  EXPECT_EQ(*GgmlCacheTypeByName("iq4_nl"), kGgmlIQ4_NL);
  EXPECT_EQ(GgmlCacheTypeByName("q3_K").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgmlTypeName(kGgmlQ5_1), "q5_1");
}

TEST(LlamaStateTest, RejectsBadMagicTruncationAndTrailingBytes) {
  const KVTensor kv = Sample(KVShape{2, 2, 4, 5}, DType::kF16);
  for (bool v_trans : {false, true}) {
    const auto blob = HandMade(kv, v_trans, 2, 0);
    auto bad = blob;
    bad[0] ^= 1;
    auto st = ParseLlamaSeqState(bad);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(st.status().message().find("magic"), std::string::npos);
    for (size_t n = 0; n < blob.size(); ++n) {
      auto r = ParseLlamaSeqState(std::span<const uint8_t>(blob.data(), n), 0);
      EXPECT_FALSE(r.ok()) << "truncated to " << n;
    }
    auto longer = blob;
    longer.push_back(0);
    EXPECT_FALSE(ParseLlamaSeqState(longer, 0).ok());
  }
}

TEST(LlamaStateTest, RejectsHostileCounts) {
  const KVTensor kv = Sample(KVShape{1, 1, 4, 2}, DType::kF16);
  auto blob = HandMade(kv, false, 1, 0);
  auto patch = [&](size_t at, uint32_t v) {
    auto b = blob;
    std::memcpy(b.data() + at, &v, 4);
    return ParseLlamaSeqState(b, 0);
  };
  EXPECT_FALSE(patch(8, 0).ok());             // no streams
  EXPECT_FALSE(patch(8, 0xffffffffu).ok());   // absurd stream count
  EXPECT_FALSE(patch(12, 0x7fffffffu).ok());  // absurd cell count
  EXPECT_FALSE(patch(12 + 4 + 4, 0x40000000u).ok());  // absurd n_seq_id
  EXPECT_FALSE(patch(12 + 4 + 2 * 12, 2).ok());       // v_trans 2
  EXPECT_FALSE(patch(12 + 4 + 2 * 12 + 4, 0).ok());   // zero layers
  EXPECT_FALSE(patch(12 + 4 + 2 * 12 + 4, 1000).ok());  // more layers than bytes
}

TEST(LlamaStateTest, ExtractChecksSectionsStreamsAndHeads) {
  const KVTensor kv = Sample(KVShape{1, 2, 4, 3}, DType::kF16);
  auto blob = HandMade(kv, false, 1, 0);
  auto st = ParseLlamaSeqState(blob);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(ExtractLlamaKV(blob, *st, 3).status().code(), StatusCode::kInvalidArgument);
  // The same state against a shorter blob: offsets out of bounds are refused.
  EXPECT_FALSE(ExtractLlamaKV(std::span<const uint8_t>(blob.data(), 40), *st, 2).ok());
  // Two sections (a sliding-window model's base and SWA caches).
  auto two = blob;
  two.insert(two.end(), blob.begin() + 8, blob.end());
  auto st2 = ParseLlamaSeqState(two);
  ASSERT_TRUE(st2.ok()) << st2.status().ToString();
  EXPECT_EQ(st2->sections.size(), 2u);
  EXPECT_EQ(ExtractLlamaKV(two, *st2, 2).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(LayoutOf(*st2).status().code(), StatusCode::kUnsupported);
}

TEST(LlamaStateTest, WriterChecksLayout) {
  const KVTensor kv = Sample(KVShape{1, 2, 4, 3}, DType::kF16);
  LlamaSeqLayout layout;
  layout.pos = {1, 2};
  EXPECT_EQ(WriteLlamaSeqState(layout, kv.view()).status().code(), StatusCode::kInvalidArgument);
  layout.pos.clear();
  layout.stream = 1;
  EXPECT_EQ(WriteLlamaSeqState(layout, kv.view()).status().code(), StatusCode::kInvalidArgument);
  layout.stream = 0;
  layout.cell_ext_bytes = 5;
  EXPECT_EQ(WriteLlamaSeqState(layout, kv.view()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cachegen::engine
