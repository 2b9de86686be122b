// Every byte of a container is covered by a checksum or a structural check:
// flipping any byte or truncating at any length must make Open or Decode fail,
// never crash, for every codec.
#include <gtest/gtest.h>

#include <random>

#include "cachegen/codec.h"

namespace cachegen {
namespace {

KVTensor RandomTensor(KVShape shape, uint32_t seed) {
  KVTensor t(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto* p = reinterpret_cast<float*>(t.data());
  for (uint64_t i = 0; i < shape.values(); ++i) p[i] = n(rng) + 0.1f * float(i % 7);
  return t;
}

// The container for `codec`, or empty when the codec is not implemented yet.
// "cachegen-lloyd" is the cachegen codec with the learned quantizer (codebook sections).
std::vector<uint8_t> EncodeOrSkip(const std::string& codec, const KVTensor& t) {
  CodecConfig cfg;
  cfg.codec = codec;
  if (codec == "cachegen-lloyd") {
    cfg.codec = "cachegen";
    cfg.quantizer = CodecConfig::Quantizer::kLloyd;
  }
  cfg.chunk_tokens = 16;
  cfg.levels = 2;
  cfg.threads = 1;
  auto enc = Encoder::Create(cfg);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  if (!enc.ok()) return {};
  auto bytes = enc->Encode(t.view());
  if (!bytes.ok() && bytes.status().code() == StatusCode::kUnsupported) return {};
  EXPECT_TRUE(bytes.ok()) << codec << ": " << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

Status OpenAndDecode(std::span<const uint8_t> bytes, KVTensor& out) {
  auto dec = Decoder::Open(bytes);
  if (!dec.ok()) return dec.status();
  for (uint32_t level = 0; level < dec->info().levels; ++level)
    CG_RETURN_IF_ERROR(dec->Decode(out.view(), level, 1));
  return Status::Ok();
}

class Corruption : public ::testing::TestWithParam<std::string> {};

TEST_P(Corruption, EveryFlipAndTruncationFails) {
  const KVShape shape{2, 2, 8, 40};
  const KVTensor input = RandomTensor(shape, 1);
  const std::vector<uint8_t> good = EncodeOrSkip(GetParam(), input);
  if (good.empty()) GTEST_SKIP() << GetParam() << " not implemented yet";
  KVTensor out(shape, DType::kF32);
  ASSERT_TRUE(OpenAndDecode(good, out).ok());

  std::vector<uint8_t> bad = good;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0xff}, uint8_t{0x01}}) {
      bad[i] ^= mask;
      EXPECT_FALSE(OpenAndDecode(bad, out).ok()) << GetParam() << ": flip 0x" << std::hex << int(mask)
                                                 << " at byte " << std::dec << i << " of " << good.size();
      bad[i] = good[i];
    }
  }
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(OpenAndDecode(std::span(good).first(n), out).ok()) << GetParam() << ": truncated at " << n;
}

TEST_P(Corruption, EveryFrameFlipFails) {
  const KVShape shape{2, 2, 8, 40};
  const KVTensor input = RandomTensor(shape, 2);
  const std::vector<uint8_t> good = EncodeOrSkip(GetParam(), input);
  if (good.empty()) GTEST_SKIP() << GetParam() << " not implemented yet";
  auto dec = Decoder::Open(good);
  ASSERT_TRUE(dec.ok());
  auto frame_span = dec->Frame(1, 0);
  ASSERT_TRUE(frame_span.ok());
  const std::vector<uint8_t> frame(frame_span->begin(), frame_span->end());
  auto info = InspectFrame(frame);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  KVTensor out(info->shape, DType::kF16);
  ASSERT_TRUE(DecodeFrame(frame, out.view()).ok());
  std::vector<uint8_t> bad = frame;
  for (size_t i = 0; i < frame.size(); ++i) {
    bad[i] ^= 0x10;
    // Header bytes fail InspectFrame; payload bytes fail DecodeFrame and the layer decode.
    auto inspected = InspectFrame(bad);
    EXPECT_FALSE(VerifyFrame(bad).ok()) << "byte " << i;  // every byte is covered by a checksum
    if (inspected.ok()) {
      EXPECT_GE(i, inspected->header_bytes);
      EXPECT_FALSE(DecodeFrame(bad, out.view(), 2).ok()) << "byte " << i;
      const bool l0 = DecodeFrameLayer(bad, 0, out.view()).ok();
      const bool l1 = DecodeFrameLayer(bad, 1, out.view()).ok();
      EXPECT_NE(l0, l1) << "exactly one layer is damaged, byte " << i;
    }
    bad[i] = frame[i];
  }
}

std::vector<std::string> CorruptionCases() {
  std::vector<std::string> names = CodecNames();
  names.push_back("cachegen-lloyd");
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, Corruption, ::testing::ValuesIn(CorruptionCases()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace cachegen
