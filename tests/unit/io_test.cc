#include "kv/io.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "kv/synthetic.h"

namespace cachegen {
namespace {

KVTensor Sample(DType dtype) {
  auto t = SyntheticKV(KVShape{3, 2, 8, 5}, dtype, 7);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

bool SameBytes(const KVTensor& a, const KVTensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

std::string TmpPath(const std::string& name) {
  return ::testing::TempDir() + "/cachegen_io_" + std::to_string(::getpid()) + "_" + name;
}

TEST(IoTest, RoundTripAllFormatsAndDtypes) {
  for (KVFileFormat f : {KVFileFormat::kNpy, KVFileFormat::kSafetensors, KVFileFormat::kKvRaw})
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (f == KVFileFormat::kNpy && d == DType::kBF16) continue;
      KVTensor t = Sample(d);
      auto bytes = SerializeKV(t, f);
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      auto back = ParseKV(*bytes, f);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_TRUE(SameBytes(t, *back)) << static_cast<int>(f) << " " << DTypeName(d);
    }
}

TEST(IoTest, NpyHeaderIsAligned) {
  auto bytes = SerializeKV(Sample(DType::kF16), KVFileFormat::kNpy);
  ASSERT_TRUE(bytes.ok());
  const size_t hlen = (*bytes)[8] | ((*bytes)[9] << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  EXPECT_EQ((*bytes)[10 + hlen - 1], '\n');
}

TEST(IoTest, NpyBf16WrittenAsF32) {
  KVTensor t = Sample(DType::kBF16);
  auto bytes = SerializeKV(t, KVFileFormat::kNpy);
  ASSERT_TRUE(bytes.ok());
  auto back = ParseKV(*bytes, KVFileFormat::kNpy);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype(), DType::kF32);
  EXPECT_TRUE(SameBytes(back->Converted(DType::kBF16), t));
}

TEST(IoTest, FilesRoundTripByExtension) {
  KVTensor t = Sample(DType::kF16);
  for (const char* ext : {".npy", ".safetensors", ".kvraw"}) {
    const std::string p = TmpPath(std::string("rt") + ext);
    ASSERT_TRUE(WriteKV(p, t).ok());
    auto back = ReadKV(p);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(SameBytes(t, *back));
    std::remove(p.c_str());
  }
  auto bad = ReadKV(TmpPath("x.bin"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("extension"), std::string::npos);
  auto missing = ReadKV(TmpPath("does_not_exist.npy"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
}

// Builds an npy file by hand with an arbitrary header dict and data size.
std::vector<uint8_t> Npy(const std::string& dict, size_t data_bytes) {
  const std::string h = dict + "\n";
  std::vector<uint8_t> b(10 + h.size() + data_bytes, 0);
  const uint8_t magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::memcpy(b.data(), magic, 8);
  b[8] = static_cast<uint8_t>(h.size() & 0xff);
  b[9] = static_cast<uint8_t>(h.size() >> 8);
  std::memcpy(b.data() + 10, h.data(), h.size());
  return b;
}

void ExpectNpyError(const std::vector<uint8_t>& b, const std::string& needle) {
  auto r = ParseKV(b, KVFileFormat::kNpy);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

// Safetensors metadata (what `cachegen capture` records) round-trips and is
// read without the tensors; a file without metadata reads as an empty map.
TEST(IoTest, SafetensorsMetadataRoundTrips) {
  const KVTensor kv = *SyntheticKV(KVShape{2, 2, 8, 16}, DType::kF16, 3);
  const std::string path = TmpPath("meta.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, kv, {{"rope", "normal"}, {"rope_dims", "8"}}).ok());
  auto meta = ReadSafetensorsMetadata(path);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->at("rope"), "normal");
  EXPECT_EQ(meta->at("rope_dims"), "8");
  EXPECT_EQ(meta->at("format"), "cachegen-kv");
  auto back = ReadKV(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::memcmp(back->data(), kv.data(), kv.size_bytes()), 0);
  const std::string junk = TmpPath("junk.safetensors");
  FILE* f = std::fopen(junk.c_str(), "wb");
  std::fputs("\xff\xff\xff\xff\xff\xff\xff\x7f", f);
  std::fclose(f);
  EXPECT_FALSE(ReadSafetensorsMetadata(junk).ok());  // a header length no file has: refused before allocating
  std::remove(path.c_str());
  std::remove(junk.c_str());
}

TEST(IoTest, NpyRejectsBadFiles) {
  const size_t n = 1 * 2 * 3 * 2 * 4;
  EXPECT_TRUE(ParseKV(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 2, 4), }", n * 4),
                      KVFileFormat::kNpy)
                  .ok());
  ExpectNpyError(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 3, 2, 4), }", n * 8), "dtype");
  ExpectNpyError(Npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1, 2, 3, 2, 4), }", n * 4), "dtype");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2, 3, 2, 4), }", n * 4), "fortran");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 2, 4), }", n * 4), "rank 4");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 3, 2, 4), }", n * 6), "axis 1");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 2, 4), }", n * 4 - 1), "bytes");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 0, 2, 4), }", 0), "zero");
  // Huge dims must be rejected from the header alone, before any allocation.
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4096, 2, 4000000000, 64, 1024), }", 0),
                 "npy");
  ExpectNpyError(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 99999999999999, 2, 4), }", 0),
                 "large");
  ExpectNpyError(Npy("{'descr': '<f4', 'shape': (1, 2, 3, 2, 4), }", n * 4), "lacks");
  ExpectNpyError(Npy("not a dict", 0), "bad header");
  ExpectNpyError({'x', 'y'}, "magic");
}

TEST(IoTest, NpyTruncatedHeaders) {
  auto good = SerializeKV(Sample(DType::kF32), KVFileFormat::kNpy);
  ASSERT_TRUE(good.ok());
  for (size_t len = 0; len < 140 && len < good->size(); ++len) {
    std::vector<uint8_t> cut(good->begin(), good->begin() + static_cast<long>(len));
    EXPECT_FALSE(ParseKV(cut, KVFileFormat::kNpy).ok()) << len;
  }
}

TEST(IoTest, RejectsNonFiniteWithPosition) {
  KVTensor t = Sample(DType::kF32);
  t.view().Set(1, KV::kValue, 2, 1, 3, std::nanf(""));
  for (KVFileFormat f : {KVFileFormat::kNpy, KVFileFormat::kSafetensors, KVFileFormat::kKvRaw}) {
    auto bytes = SerializeKV(t, f);
    ASSERT_TRUE(bytes.ok());
    auto r = ParseKV(*bytes, f);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("layer 1"), std::string::npos) << r.status().message();
  }
}

std::vector<uint8_t> Safetensors(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> b(8 + json.size() + data_bytes, 0);
  const uint64_t n = json.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, json.data(), json.size());
  return b;
}

void ExpectStError(const std::vector<uint8_t>& b, const std::string& needle) {
  auto r = ParseKV(b, KVFileFormat::kSafetensors);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(IoTest, SafetensorsRejectsBadFiles) {
  const std::string k = R"("layers.0.k":{"dtype":"F16","shape":[2,1,4],"data_offsets":[0,16]})";
  const std::string v = R"("layers.0.v":{"dtype":"F16","shape":[2,1,4],"data_offsets":[16,32]})";
  EXPECT_TRUE(ParseKV(Safetensors("{" + k + "," + v + "}", 32), KVFileFormat::kSafetensors).ok());
  ExpectStError(Safetensors("{" + k + "," + v + "}", 31), "outside");
  ExpectStError(Safetensors("{" + k + "}", 32), "layers must be");
  ExpectStError(Safetensors("{" + k + "," + v + R"(,"embed":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 32),
                "unexpected tensor");
  ExpectStError(Safetensors(R"({"layers.0.k":{"dtype":"I8","shape":[2,1,4],"data_offsets":[0,8]},)" + v + "}", 32),
                "dtype");
  ExpectStError(Safetensors(R"({"layers.0.k":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},)" + v + "}", 32),
                "rank 2");
  ExpectStError(Safetensors(R"({"layers.0.k":{"dtype":"F16","shape":[2,1,3],"data_offsets":[0,12]},)" + v + "}", 32),
                "differs");
  ExpectStError(Safetensors(R"({"layers.0.k":{"dtype":"F16","shape":[2,1,4],"data_offsets":[0,14]},)" + v + "}", 32),
                "bytes");
  ExpectStError(Safetensors(R"({"layers.0.k":{"dtype":"F16","shape":[2,1,4],"data_offsets":[20,4]},)" + v + "}", 32),
                "outside");
  ExpectStError(Safetensors("{" + k + "," + v, 32), "JSON");
  ExpectStError(Safetensors("[1,2]", 0), "JSON");
  std::vector<uint8_t> huge(8, 0xff);
  ExpectStError(huge, "exceeds file size");
  ExpectStError({1, 2, 3}, "truncated");
}

TEST(IoTest, KvRawRejectsBadFiles) {
  auto good = SerializeKV(Sample(DType::kF16), KVFileFormat::kKvRaw);
  ASSERT_TRUE(good.ok());
  for (size_t len : {0, 8, 31, 32, 100}) {
    std::vector<uint8_t> cut(good->begin(), good->begin() + static_cast<long>(len));
    EXPECT_FALSE(ParseKV(cut, KVFileFormat::kKvRaw).ok()) << len;
  }
  std::vector<uint8_t> b = *good;
  b[12] = 9;
  EXPECT_FALSE(ParseKV(b, KVFileFormat::kKvRaw).ok());
  b = *good;
  const uint32_t big = 0xffffffffu;
  std::memcpy(b.data() + 28, &big, 4);  // tokens
  auto r = ParseKV(b, KVFileFormat::kKvRaw);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kvraw"), std::string::npos);
}

}  // namespace
}  // namespace cachegen
