// The CUDA decoder's plan (gpu_plan.h): hostile input fails cleanly (the
// same inputs the CPU decoder rejects, and whitelisted features only), and
// output layouts are checked. Its output on valid input is compared with the
// reference by the parity harness (schedule_parity_test.cc), on the host and
// on an emulated warp.
#include <gtest/gtest.h>

#include "codec/codec.h"
#include "format/frame.h"
#include "gpu_cases.h"

namespace cachegen {
namespace {

using gpu_test::GpuCase;

using gpu_test::FrameParts;

std::vector<uint8_t> SmallFrame(const CodecConfig& cfg, KVShape shape = {1, 2, 16, 24}) {
  GpuCase c{"small", shape, cfg};
  const std::vector<uint8_t> container = gpu_test::EncodeCase(c);
  auto d = Decoder::Open(container);
  EXPECT_TRUE(d.ok());
  auto f = d->Frame(0, 0);
  return std::vector<uint8_t>(f->begin(), f->end());
}

FrameParts Split(const std::vector<uint8_t>& frame) { return gpu_test::SplitFrame(frame); }

std::vector<uint8_t> Join(const FrameParts& parts) { return WriteFrame(parts.header, parts.sections); }

// The CPU decoder and the host run agree: both fail, or both succeed with the
// same bytes.
void ExpectSameOutcome(const std::vector<uint8_t>& frame, const KVShape& shape, const std::string& what) {
  const gpu::OutputLayout layout = gpu::ContiguousLayout(shape, DType::kF16);
  KVTensor want(shape, DType::kF16);
  const Status cpu = DecodeFrame(frame, want.view(), 1);
  Status gpu_status;
  std::vector<uint8_t> got(want.size_bytes());
  if (auto plan = gpu::PlanFrame(frame, 0, layout); plan.ok()) {
    gpu_status = gpu::RunOnHost(*plan, frame, got.data());
  } else {
    gpu_status = plan.status();
  }
  ASSERT_EQ(cpu.ok(), gpu_status.ok()) << what << ": cpu " << cpu.ToString() << ", gpu " << gpu_status.ToString();
  if (!cpu.ok()) {
    EXPECT_TRUE(gpu_status.code() == StatusCode::kCorrupt || gpu_status.code() == StatusCode::kUnsupported)
        << what << ": " << gpu_status.ToString();
    return;
  }
  EXPECT_EQ(gpu_test::FirstDifference(std::vector<uint8_t>(want.data(), want.data() + want.size_bytes()), got), "")
      << what;
}

// Every byte of every section changed (checksums recomputed, so the payload
// parsers and the device code see it): the outcome matches the CPU decoder's.
TEST(GpuPlan, ChangedPayloadBytesMatchCpuDecoder) {
  const KVShape shape{1, 2, 16, 24};
  for (bool rotate : {false, true}) {
    CodecConfig cfg = gpu_test::Cfg(3, 0, 2, rotate);
    cfg.recent_tokens = 6;
    cfg.recent_step_scale = 0;
    const FrameParts parts = Split(SmallFrame(cfg, shape));
    for (size_t s = 0; s < parts.sections.size(); ++s)
      for (size_t b = 0; b < parts.sections[s].bytes.size(); ++b)
        for (uint8_t mask : {0x01, 0x80, 0xff}) {
          FrameParts changed = parts;
          changed.sections[s].bytes[b] ^= mask;
          ExpectSameOutcome(Join(changed), shape,
                            "section " + std::to_string(s) + " byte " + std::to_string(b) + " ^ " + std::to_string(mask));
        }
  }
}

TEST(GpuPlan, TruncatedSectionsMatchCpuDecoder) {
  const KVShape shape{1, 2, 16, 24};
  const FrameParts parts = Split(SmallFrame(gpu_test::Cfg(3, 0, 2), shape));
  for (size_t s = 0; s < parts.sections.size(); ++s)
    for (size_t len = 0; len < parts.sections[s].bytes.size(); ++len) {
      FrameParts changed = parts;
      changed.sections[s].bytes.resize(len);
      ExpectSameOutcome(Join(changed), shape, "section " + std::to_string(s) + " cut to " + std::to_string(len));
    }
}

TEST(GpuPlan, TruncatedOrFlippedContainerIsRejected) {
  GpuCase c{"c", {1, 2, 16, 40}, gpu_test::Cfg(2, 16)};
  const std::vector<uint8_t> container = gpu_test::EncodeCase(c);
  const gpu::OutputLayout layout = gpu::ContiguousLayout(c.shape, DType::kF16);
  for (size_t len = 0; len < container.size(); len += 7) {
    auto plan = gpu::PlanContainer(std::span(container).first(len), 0, layout);
    EXPECT_FALSE(plan.ok()) << len;
  }
  for (size_t b = 0; b < container.size(); b += 3) {
    std::vector<uint8_t> bad = container;
    bad[b] ^= 0x10;
    auto plan = gpu::PlanContainer(bad, 0, layout);
    EXPECT_FALSE(plan.ok()) << b;
  }
}

// CPU-only features are refused as unsupported, bits the format does not define as corrupt.
// What the plan does not implement is kUnsupported; what the format does not
// define, or a frame cannot satisfy, gets the CPU decoder's verdict.
TEST(GpuPlan, UnimplementedFeaturesAreUnsupported) {
  const KVShape shape{1, 2, 16, 24};
  const FrameParts parts = Split(SmallFrame(gpu_test::Cfg(3, 0, 2), shape));
  const gpu::OutputLayout layout = gpu::ContiguousLayout(shape, DType::kF16);
  auto expect_code = [&](const FrameParts& p, StatusCode code, const char* what) {
    auto plan = gpu::PlanFrame(Join(p), 0, layout);
    ASSERT_FALSE(plan.ok()) << what;
    EXPECT_EQ(plan.status().code(), code) << what << ": " << plan.status().ToString();
  };
  auto expect_unsupported = [&](const FrameParts& p, const char* what) { expect_code(p, StatusCode::kUnsupported, what); };
  auto expect_cpu_verdict = [&](const FrameParts& p, const char* what) {
    KVTensor out(shape, DType::kF16);
    const Status cpu = DecodeFrame(Join(p), out.view());
    ASSERT_FALSE(cpu.ok()) << what;
    expect_code(p, cpu.code(), what);
  };
  {
    FrameParts p = parts;  // a reference to a model profile nobody gave: not found
    p.header.params[0] = 2;
    p.header.params[1] |= 4;
    for (int i = 0; i < 8; ++i) p.header.params.push_back(0x11);
    expect_code(p, StatusCode::kNotFound, "profile reference");
  }
  for (uint8_t bit : {8, 16, 32, 64, 128}) {
    FrameParts p = parts;  // params flags the format does not define: corrupt, as on the CPU
    p.header.params[0] = 2;
    p.header.params[1] |= bit;
    expect_code(p, StatusCode::kCorrupt, "params flag");
  }
  {
    FrameParts p = parts;
    p.header.params[0] = 3;
    expect_unsupported(p, "params version 3");
  }
  for (uint8_t bit : {2, 4, 8}) {
    FrameParts p = parts;  // profile statistics/tables without a profile, a codebook that is not there
    p.sections[1].bytes[0] |= bit;
    expect_cpu_verdict(p, "section flag");
  }
  {
    FrameParts p = parts;  // a section flag the format does not define
    p.sections[1].bytes[0] |= 128;
    expect_code(p, StatusCode::kCorrupt, "section flag 128");
  }
  {
    CodecConfig lloyd = gpu_test::Cfg(1, 0, 2);  // sections with reconstruction codebooks
    lloyd.quantizer = CodecConfig::Quantizer::kLloyd;
    const KVShape big{1, 2, 16, 96};
    const FrameParts p = Split(SmallFrame(lloyd, big));
    bool codebook = false;
    for (const auto& sec : p.sections) codebook |= !sec.bytes.empty() && (sec.bytes[0] & 8);
    ASSERT_TRUE(codebook) << "expected a codebook section at 1 bit/value";
    auto plan = gpu::PlanFrame(Join(p), 0, gpu::ContiguousLayout(big, DType::kF16));
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();  // taken: schedule_parity_test compares the bytes
  }
  {
    CodecConfig fp16;
    fp16.codec = "fp16";
    FrameParts p = Split(SmallFrame(fp16, shape));
    expect_unsupported(p, "fp16 codec");
  }
}

TEST(GpuPlan, OutputLayoutIsChecked) {
  const KVShape shape{1, 2, 16, 24};
  const std::vector<uint8_t> frame = SmallFrame(gpu_test::Cfg(3, 0, 2), shape);
  gpu::OutputLayout o = gpu::ContiguousLayout(shape, DType::kF16);
  EXPECT_TRUE(gpu::PlanFrame(frame, 0, o).ok());
  EXPECT_FALSE(gpu::PlanFrame(frame, 1, o).ok());  // past the output's tokens
  o.capacity -= 1;
  EXPECT_FALSE(gpu::PlanFrame(frame, 0, o).ok());
  o = gpu::ContiguousLayout(shape, DType::kF16);
  o.strides.dim = 2;
  EXPECT_FALSE(gpu::PlanFrame(frame, 0, o).ok());
  o = gpu::ContiguousLayout(shape, DType::kF16);
  o.page_tokens = 16;
  o.page_offsets = {0};  // two pages needed
  EXPECT_FALSE(gpu::PlanFrame(frame, 0, o).ok());
  o.page_offsets = {0, -1};
  EXPECT_FALSE(gpu::PlanFrame(frame, 0, o).ok());
  o.page_offsets = {0, 16 * 32};
  EXPECT_TRUE(gpu::PlanFrame(frame, 0, o).ok());
  const KVShape other{1, 2, 8, 24};
  EXPECT_FALSE(gpu::PlanFrame(frame, 0, gpu::ContiguousLayout(other, DType::kF16)).ok());
}

}  // namespace
}  // namespace cachegen
