#include "cachegen/kv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"

namespace cachegen {
namespace {

TEST(Half, RoundTripsEveryF16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(F32ToF16(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0.00048828125f), 0x3c02);
  EXPECT_EQ(F32ToF16(70000.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e-9f), 0x8000);
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
}

TEST(KVView, ContiguousAndTransposedViewsAgree) {
  KVShape s{2, 3, 4, 5};
  KVTensor t(s, DType::kF32);
  auto v = t.view();
  for (uint32_t l = 0; l < 2; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t tok = 0; tok < 5; ++tok)
        for (uint32_t h = 0; h < 3; ++h)
          for (uint32_t d = 0; d < 4; ++d) v.Set(l, kv, tok, h, d, l * 1000 + int(kv) * 100 + tok * 10 + h + d * 0.1f);

  // The same data stored token-fastest (V-transposed style): [layer][kv][head][dim][token].
  std::vector<float> transposed(s.values());
  KVStrides st{2 * 3 * 4 * 5, 3 * 4 * 5, 1, 4 * 5, 5};
  KVView tv(transposed.data(), DType::kF32, s, st);
  ASSERT_TRUE(CopyKV(v, tv).ok());
  EXPECT_FLOAT_EQ(transposed[1 * st.layer + 1 * st.kv + 2 * st.head + 3 * st.dim + 4], v.Get(1, KV::kValue, 4, 2, 3));

  KVTensor back(s, DType::kF32);
  ASSERT_TRUE(CopyKV(tv, back.view()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), t.data(), t.size_bytes()));
}

TEST(KVView, PagedViewAndTokenSubview) {
  KVShape s{1, 1, 2, 6};
  // Two pages of 4 tokens, stored in reverse order in memory.
  std::vector<float> mem(2 * 2 * 4 * 2);  // [page][kv][token-in-page][dim]
  const int64_t page_elems = 2 * 4 * 2;
  std::vector<int64_t> pages = {page_elems, 0};
  KVStrides st{0, 4 * 2, 2, 2, 1};
  KVView pv(mem.data(), DType::kF32, s, st, KVPaging{4, pages});
  for (uint32_t tok = 0; tok < 6; ++tok) pv.Set(0, KV::kValue, tok, 0, 1, float(tok));
  EXPECT_EQ(mem[page_elems + 8 + 2 * 2 + 1], 2.0f);  // token 2 in page 0 (stored second)
  EXPECT_EQ(mem[0 + 8 + 1 * 2 + 1], 5.0f);           // token 5 = page 1, slot 1
  auto sub = pv.Tokens(3, 3);
  EXPECT_EQ(sub.Get(0, KV::kValue, 0, 0, 1), 3.0f);
  EXPECT_EQ(sub.Get(0, KV::kValue, 2, 0, 1), 5.0f);
}

TEST(KVShape, ValidateRejectsZeroAndHuge) {
  EXPECT_FALSE((KVShape{0, 8, 128, 10}).Validate().ok());
  EXPECT_FALSE((KVShape{1, 8, 128, 1u << 21}).Validate().ok());
  EXPECT_TRUE((KVShape{32, 8, 128, 4096}).Validate().ok());
}

TEST(KVTensor, CheckFiniteNamesTheValue) {
  KVTensor t(KVShape{2, 1, 4, 3}, DType::kF16);
  t.view().Set(1, KV::kKey, 2, 0, 3, NAN);
  Status s = CheckFinite(t.view());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 1, token 2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace cachegen
