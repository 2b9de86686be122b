// The CUDA decoder on a device: output bit-identical to cachegen::Decoder for
// every case of gpu_cases.h (the cases gpu_plan_test runs through the same
// device code on the CPU), errors reported per job. Skipped, with the reason,
// where no CUDA device is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "cachegen/cuda_decoder.h"
#include "codec/codec.h"
#include "format/frame.h"
#include "gpu_cases.h"

namespace cachegen {
namespace {

using gpu_test::GpuCase;

#define SKIP_WITHOUT_DEVICE()                                                      \
  do {                                                                             \
    if (Status s = cuda::DeviceStatus(); !s.ok()) GTEST_SKIP() << s.ToString();    \
  } while (0)

// A device buffer holding a layout's bytes, copied from / to host vectors.
struct DeviceBytes {
  void* ptr = nullptr;
  size_t size = 0;
  explicit DeviceBytes(const std::vector<uint8_t>& init) : size(init.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, size), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, init.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(ptr); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(size);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, size, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

class CudaDecoderCase : public testing::TestWithParam<GpuCase> {};

TEST_P(CudaDecoderCase, MatchesCpuDecoder) {
  SKIP_WITHOUT_DEVICE();
  const GpuCase& c = GetParam();
  const std::vector<uint8_t> container = gpu_test::EncodeCase(c);
  ASSERT_FALSE(container.empty());
  auto d = Decoder::Open(container);
  ASSERT_TRUE(d.ok());
  auto dec = cuda::Decoder::Create();
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  const gpu::OutputLayout layout = gpu_test::CaseLayout(c);
  for (uint32_t level = 0; level < d->info().levels; ++level) {
    std::vector<uint8_t> want;
    ASSERT_TRUE(gpu_test::ReferenceDecode(container, level, layout, &want).ok());
    DeviceBytes out(gpu_test::Buffer(layout));
    Status st = (*dec)->Decode(container, level, cuda::DeviceKV{out.ptr, layout});
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(gpu_test::FirstDifference(want, out.Download()), "") << "level " << level;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecoderCase, testing::ValuesIn(gpu_test::GpuCases()),
                         [](const testing::TestParamInfo<GpuCase>& i) { return i.param.name; });

// Payload bytes changed (checksums recomputed): the device fails exactly when
// the CPU decoder does, and otherwise writes the same bytes.
TEST(CudaDecoder, ChangedPayloadsMatchCpuDecoder) {
  SKIP_WITHOUT_DEVICE();
  const KVShape shape{1, 2, 16, 24};
  GpuCase c{"small", shape, gpu_test::Cfg(3, 0, 2)};
  const std::vector<uint8_t> container = gpu_test::EncodeCase(c);
  auto d = Decoder::Open(container);
  ASSERT_TRUE(d.ok());
  const std::vector<uint8_t> frame(d->Frame(0, 0)->begin(), d->Frame(0, 0)->end());
  const gpu_test::FrameParts parts = gpu_test::SplitFrame(frame);
  const std::vector<EncodedSection>& sections = parts.sections;
  auto dec = cuda::Decoder::Create();
  ASSERT_TRUE(dec.ok());
  const gpu::OutputLayout layout = gpu::ContiguousLayout(shape, DType::kF16);
  int failures = 0;
  for (size_t s = 0; s < sections.size(); ++s)
    for (size_t b = 0; b < sections[s].bytes.size(); ++b) {
      std::vector<EncodedSection> changed = sections;
      changed[s].bytes[b] ^= 0x5a;
      const std::vector<uint8_t> bad = WriteFrame(parts.header, changed);
      KVTensor want(shape, DType::kF16);
      const Status cpu = DecodeFrame(bad, want.view(), 1);
      DeviceBytes out(gpu_test::Buffer(layout));
      Status st = (*dec)->PrepareFrame(bad, 0, cuda::DeviceKV{out.ptr, layout});
      if (st.ok()) st = (*dec)->Run();
      ASSERT_EQ(cpu.ok(), st.ok()) << "section " << s << " byte " << b << ": " << cpu.ToString() << " / "
                                   << st.ToString();
      failures += !st.ok();
      if (cpu.ok()) {
        EXPECT_EQ(gpu_test::FirstDifference(std::vector<uint8_t>(want.data(), want.data() + want.size_bytes()),
                                            out.Download()),
                  "");
      }
    }
  EXPECT_GT(failures, 0);
}

TEST(CudaDecoder, RunWithoutPrepareFails) {
  SKIP_WITHOUT_DEVICE();
  auto dec = cuda::Decoder::Create();
  ASSERT_TRUE(dec.ok());
  EXPECT_FALSE((*dec)->Run().ok());
}

}  // namespace
}  // namespace cachegen
