// The C API: round trip, inspect, and error reporting.
#include "cachegen/cachegen.h"

#include <gtest/gtest.h>

#include "cachegen/profile.h"
#include "kv/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

TEST(CApi, RoundTripFp16) {
  const uint32_t L = 2, H = 2, D = 8, T = 20;
  std::vector<float> in(size_t{L} * 2 * T * H * D);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(float(i) * 0.37f);
  cg_config cfg;
  cg_config_default(&cfg);
  cfg.codec = "fp16";
  cfg.chunk_tokens = 8;
  cfg.token_start = 5;
  uint8_t* buf = nullptr;
  size_t len = 0;
  char err[128];
  ASSERT_EQ(cg_encode(in.data(), CG_F32, L, H, D, T, &cfg, &buf, &len, err, sizeof err), CG_OK) << err;
  ASSERT_NE(buf, nullptr);
  EXPECT_GT(len, in.size() * 2);

  cg_info info;
  ASSERT_EQ(cg_inspect(buf, len, &info, err, sizeof err), CG_OK) << err;
  EXPECT_STREQ(info.codec, "fp16");
  EXPECT_EQ(info.dtype, CG_F32);
  EXPECT_EQ(info.layers, L);
  EXPECT_EQ(info.kv_heads, H);
  EXPECT_EQ(info.head_dim, D);
  EXPECT_EQ(info.tokens, T);
  EXPECT_EQ(info.token_start, 5u);
  EXPECT_EQ(info.levels, 1u);
  EXPECT_EQ(info.chunks, 3u);
  EXPECT_EQ(info.bytes, len);

  std::vector<float> out(in.size());
  ASSERT_EQ(cg_decode(buf, len, 0, CG_F32, out.data(), out.size() * 4, 2, err, sizeof err), CG_OK) << err;
  for (size_t i = 0; i < in.size(); ++i) ASSERT_NEAR(out[i], in[i], 1e-3) << i;
  std::vector<uint16_t> half(in.size());
  EXPECT_EQ(cg_decode(buf, len, 0, CG_F16, half.data(), half.size() * 2, 1, err, sizeof err), CG_OK) << err;

  // Errors: wrong buffer size, bad level, corrupt bytes, truncated message buffer.
  EXPECT_EQ(cg_decode(buf, len, 0, CG_F32, out.data(), out.size() * 4 - 1, 1, err, sizeof err),
            CG_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(err, "bytes"), nullptr);
  EXPECT_EQ(cg_decode(buf, len, 1, CG_F32, out.data(), out.size() * 4, 1, err, sizeof err), CG_INVALID_ARGUMENT);
  buf[len - 1] ^= 1;
  EXPECT_EQ(cg_decode(buf, len, 0, CG_F32, out.data(), out.size() * 4, 1, err, sizeof err), CG_CORRUPT);
  EXPECT_GT(std::strlen(err), 0u);
  char tiny[4];
  EXPECT_EQ(cg_inspect(buf, 3, &info, tiny, sizeof tiny), CG_CORRUPT);
  EXPECT_EQ(std::strlen(tiny), 3u);
  EXPECT_EQ(cg_inspect(buf, 3, &info, nullptr, 0), CG_CORRUPT);
  cg_free(buf);
  cg_free(nullptr);
}

TEST(CApi, Version) {
  const std::string v = cg_version();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
}

TEST(CApi, EncodeErrors) {
  float x[16] = {};
  uint8_t* buf = reinterpret_cast<uint8_t*>(1);
  size_t len = 7;
  char err[128];
  cg_config cfg;
  cg_config_default(&cfg);
  cfg.codec = "no-such-codec";
  EXPECT_EQ(cg_encode(x, CG_F32, 1, 1, 8, 1, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
  EXPECT_EQ(buf, nullptr);
  EXPECT_EQ(len, 0u);
  EXPECT_NE(std::strstr(err, "no-such-codec"), nullptr);
  cfg.codec = "fp16";
  EXPECT_EQ(cg_encode(x, 7, 1, 1, 8, 1, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
  EXPECT_EQ(cg_encode(x, CG_F32, 0, 1, 8, 1, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
  buf = reinterpret_cast<uint8_t*>(1);
  len = 7;
  EXPECT_EQ(cg_encode(nullptr, CG_F32, 1, 1, 8, 1, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
  EXPECT_EQ(buf, nullptr);  // reset on every failure, so cg_free(buf) is always safe
  EXPECT_EQ(len, 0u);
  x[3] = NAN;
  EXPECT_EQ(cg_encode(x, CG_F32, 1, 1, 8, 1, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
}


// A profile loaded from its bytes codes with a KL target and decodes.
TEST(CApi, ProfileAndKlTarget) {
  const cachegen::KVShape shape{2, 2, 16, 64};
  const cachegen::KVTensor kv = *cachegen::SyntheticKV(shape, cachegen::DType::kF32, 5);
  const cachegen::KVView views[] = {kv.view()};
  cachegen::ProfileTrainOptions o;
  o.key_transform = false;
  auto trained = cachegen::Profile::Train(views, cachegen::CodecConfig{}, o);
  ASSERT_TRUE(trained.ok());
  auto p = (*trained)->WithSensitivity(std::vector<float>{1e-3f, 1e-2f, 2e-3f, 5e-3f});
  ASSERT_TRUE(p.ok());
  char err[256];
  cg_profile* prof = nullptr;
  ASSERT_EQ(cg_profile_load((*p)->bytes().data(), (*p)->bytes().size(), &prof, err, sizeof err), CG_OK) << err;
  EXPECT_EQ(cg_profile_id(prof), (*p)->id());
  const std::vector<uint8_t> junk(64, 7);
  cg_profile* bad = prof;
  EXPECT_EQ(cg_profile_load(junk.data(), junk.size(), &bad, err, sizeof err), CG_CORRUPT);
  EXPECT_EQ(bad, nullptr);

  cg_config cfg;
  cg_config_default(&cfg);
  EXPECT_EQ(cfg.profile, nullptr);
  cfg.max_kl = 1e-3;  // without a profile: refused
  uint8_t* buf = nullptr;
  size_t len = 0;
  EXPECT_EQ(cg_encode(kv.data(), CG_F32, 2, 2, 16, 64, &cfg, &buf, &len, err, sizeof err), CG_INVALID_ARGUMENT);
  cfg.profile = prof;
  ASSERT_EQ(cg_encode(kv.data(), CG_F32, 2, 2, 16, 64, &cfg, &buf, &len, err, sizeof err), CG_OK) << err;
  std::vector<float> out(shape.values());
  // The frames reference the profile: decoding needs it given, and only it.
  EXPECT_EQ(cg_decode(buf, len, 0, CG_F32, out.data(), out.size() * sizeof(float), 1, err, sizeof err), CG_NOT_FOUND);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>((*p)->id()));
  EXPECT_NE(std::string(err).find(hex), std::string::npos) << err;
  cg_profile* other = nullptr;
  ASSERT_EQ(cg_profile_load((*trained)->bytes().data(), (*trained)->bytes().size(), &other, err, sizeof err), CG_OK);
  EXPECT_EQ(cg_decode_using_profile(buf, len, other, 0, CG_F32, out.data(), out.size() * sizeof(float), 1, err,
                                    sizeof err),
            CG_NOT_FOUND);
  EXPECT_EQ(cg_decode_using_profile(buf, len, prof, 0, CG_F32, out.data(), out.size() * sizeof(float), 1, err,
                                    sizeof err),
            CG_OK)
      << err;
  cg_profile_free(other);
  cg_profile_free(prof);
  cg_profile_free(nullptr);
  cg_free(buf);
}

}  // namespace
