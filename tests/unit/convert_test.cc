// StoreRow / LoadRow: the AVX2/F16C conversions equal half.h's scalar ones
// bit for bit, and both paths touch exactly n elements at any byte alignment.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "common/convert.h"
#include "common/half.h"
#include "common/simd.h"

namespace cachegen {
namespace {

// Every 997th bit pattern of all 2^32 floats plus the special values around
// f16 and bf16 rounding boundaries.
std::vector<float> Sweep() {
  std::vector<float> v;
  for (uint64_t x = 0; x < (uint64_t{1} << 32); x += 997) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(x)));
  for (uint32_t x : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu,
                     0x477ff000u, 0x477fefffu, 0x477fe000u, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                     0x00000001u, 0x3f800000u, 0x3f801000u, 0x3f803000u, 0x3f808000u, 0x3f818000u})
    for (int k = 0; k < 9; ++k) v.push_back(std::bit_cast<float>(x));
  return v;
}

TEST(ConvertTest, SimdMatchesScalarBitForBit) {
  const std::vector<float> in = Sweep();
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    const size_t es = DTypeSize(dt);
    std::vector<uint8_t> ref(in.size() * es + 1), got(in.size() * es + 1);
    simd::SetEnabled(false);
    StoreRow(dt, in.data(), in.size(), ref.data());
    for (size_t i = 0; i < in.size() && dt == DType::kF16; i += 1001) {
      uint16_t h;
      std::memcpy(&h, &ref[2 * i], 2);
      ASSERT_EQ(h, F32ToF16(in[i]));
    }
    simd::SetEnabled(true);
    // Odd byte offset and a length that leaves a scalar tail.
    StoreRow(dt, in.data(), in.size() - 3, got.data() + 1);
    for (size_t i = 0; i < (in.size() - 3) * es; ++i)
      ASSERT_EQ(ref[i], got[i + 1]) << DTypeName(dt) << " value " << i / es << " bits 0x" << std::hex
                                    << std::bit_cast<uint32_t>(in[i / es]);
    EXPECT_EQ(got[(in.size() - 3) * es + 1], 0) << "wrote past n";
  }
}

// All 2^16 f16/bf16 bit patterns (NaN payloads, signalling NaNs, subnormals),
// read from an odd byte address with a scalar tail.
TEST(ConvertTest, LoadRowMatchesScalarOnEveryPattern) {
  std::vector<uint8_t> in(2 * 65536 + 1);
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t h = static_cast<uint16_t>(x);
    std::memcpy(&in[1 + 2 * x], &h, 2);
  }
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (bool simd_on : {false, true}) {
      simd::SetEnabled(simd_on);
      std::vector<float> got(65536, 0.0f);
      const size_t n = 65536 - 5;
      LoadRow(dt, in.data() + 1, n, got.data());
      for (uint32_t x = 0; x < n; ++x) {
        const float want = dt == DType::kF16 ? F16ToF32(static_cast<uint16_t>(x)) : BF16ToF32(static_cast<uint16_t>(x));
        ASSERT_EQ(std::bit_cast<uint32_t>(got[x]), std::bit_cast<uint32_t>(want))
            << DTypeName(dt) << " simd=" << simd_on << " pattern 0x" << std::hex << x;
      }
      EXPECT_EQ(got[n], 0.0f) << "wrote past n";
    }
  }
  simd::SetEnabled(true);
}

}  // namespace
}  // namespace cachegen
