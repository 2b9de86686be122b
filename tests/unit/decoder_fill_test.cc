// Decoder::Decode(dtype) returns a tensor that was not zero-filled first
// (KVTensor::Unfilled): that is only right if decoding writes every byte of
// the output. Here every codec, in several settings, output dtypes and thread
// counts, decodes into buffers prefilled with two different byte patterns:
// a byte the decoder leaves alone keeps its pattern and the two outputs
// differ there.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "kv/synthetic.h"

namespace cachegen {
namespace {

struct FillCase {
  std::string name;
  CodecConfig config;
};

std::vector<FillCase> Cases() {
  std::vector<FillCase> cases;
  for (const std::string& codec : CodecNames()) {
    CodecConfig c;
    c.codec = codec;
    c.chunk_tokens = 10;  // 37 tokens: chunks of 10, 10, 10 and 7
    c.levels = 2;
    cases.push_back({codec, c});
  }
  CodecConfig c;
  c.chunk_tokens = 10;
  c.rotate = true;
  c.group_tokens = 3;
  cases.push_back({"cachegen_rotate_group3", c});
  c = CodecConfig{};
  c.chunk_tokens = 10;
  c.recent_tokens = 5;
  c.recent_step_scale = 0;  // exact f16 tail
  c.rope.kind = RopeConfig::Kind::kNeox;
  cases.push_back({"cachegen_recent_exact_rope", c});
  c = CodecConfig{};
  c.chunk_tokens = 1;  // 1-token chunks
  cases.push_back({"cachegen_chunk1", c});
  return cases;
}

// Index of the first byte where a and b differ, or -1.
int64_t FirstDifference(const KVTensor& a, const KVTensor& b) {
  for (size_t i = 0; i < a.size_bytes(); ++i)
    if (a.data()[i] != b.data()[i]) return static_cast<int64_t>(i);
  return -1;
}

TEST(DecoderFill, EveryOutputByteIsWritten) {
  const KVShape shape{2, 2, 64, 37};
  Result<KVTensor> kv = SyntheticKV(shape, DType::kF16, 11);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  for (const FillCase& fc : Cases()) {
    Result<Encoder> enc = Encoder::Create(fc.config);
    ASSERT_TRUE(enc.ok()) << fc.name << ": " << enc.status().ToString();
    Result<std::vector<uint8_t>> bytes = enc->Encode(kv->view());
    ASSERT_TRUE(bytes.ok()) << fc.name << ": " << bytes.status().ToString();
    Result<Decoder> dec = Decoder::Open(*bytes);
    ASSERT_TRUE(dec.ok()) << fc.name;
    for (uint32_t level = 0; level < dec->info().levels; ++level)
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
        for (uint32_t threads : {1u, 3u}) {
          const std::string where = fc.name + " level " + std::to_string(level) + " " + DTypeName(dtype) +
                                    " threads " + std::to_string(threads);
          KVTensor a(shape, dtype), b(shape, dtype);
          std::memset(a.data(), 0xa5, a.size_bytes());
          std::memset(b.data(), 0x5a, b.size_bytes());
          ASSERT_TRUE(dec->Decode(a.view(), level, threads).ok()) << where;
          ASSERT_TRUE(dec->Decode(b.view(), level, threads).ok()) << where;
          const int64_t at = FirstDifference(a, b);
          EXPECT_EQ(at, -1) << where << ": byte " << at << " of " << a.size_bytes() << " not written";
          Result<KVTensor> t = dec->Decode(dtype, level, threads);
          ASSERT_TRUE(t.ok()) << where;
          ASSERT_EQ(t->size_bytes(), a.size_bytes()) << where;
          EXPECT_EQ(FirstDifference(*t, a), -1) << where;
        }
  }
}

TEST(DecoderFill, ConstructorStillZeroFills) {
  const KVShape shape{1, 2, 8, 16};
  {
    // Leave a freed block of the same size full of ones for the next allocation.
    KVTensor dirty = KVTensor::Unfilled(shape, DType::kF16);
    EXPECT_EQ(dirty.size_bytes(), shape.values() * 2);
    std::memset(dirty.data(), 0xff, dirty.size_bytes());
  }
  KVTensor t(shape, DType::kF16);
  ASSERT_EQ(t.size_bytes(), shape.values() * 2);
  for (size_t i = 0; i < t.size_bytes(); ++i) ASSERT_EQ(t.data()[i], 0) << i;
  // Copies keep the bytes.
  std::memset(t.data(), 0x3c, t.size_bytes());
  const KVTensor copy = t;
  EXPECT_EQ(FirstDifference(copy, t), -1);
}

}  // namespace
}  // namespace cachegen
