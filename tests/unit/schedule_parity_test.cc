// The section decoder's one parity harness (as ggml's test-backend-ops checks
// every backend against one reference): every schedule against the reference
// schedule on the same inputs, byte for byte.
//
// Schedules: the reference (generic schedule, SIMD off: what FORMAT.md points
// at), the CPU with SIMD and the fused schedule's 8-lane transforms, the same
// with 16-lane (AVX-512) transforms, the CUDA schedule's plan run on the host
// (one thread per job) and on an emulated warp (32 threads per job, the
// device's cooperative steps), and the CUDA device where one is present.
//
// Inputs: containers of every feature combination the format has (with and
// without a model profile, each profile feature on and off, RoPE kinds and
// partial dims, rotation, delta groups, recent windows, escapes, one-token
// chunks), the GPU cases (output layouts: padded rows, pages), each in every
// output dtype; hostile frames: payload bytes changed with the checksums
// recomputed, so that each schedule's own stream validation decides; and the
// decode fuzzer's corpus, as containers and as frames.
//
// A schedule gives the reference's verdict and, where it accepts, the
// reference's bytes. The CUDA schedules may answer kUnsupported for frames
// with features outside their table (section_format.h kCudaSchedule); the
// harness says which and checks they take every other frame.
#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "codec/cachegen/fused_decode.h"
#include "codec/cachegen/gpu_groups.h"
#include "codec/cachegen/gpu_plan.h"
#include "codec/codec.h"
#include "common/simd.h"
#include "format/frame.h"
#include "fuzz/fuzz_profiles.h"
#include "gpu_cases.h"
#include "kv/synthetic.h"

#if defined(CACHEGEN_PARITY_CUDA_DEVICE)
#include <cuda_runtime.h>

#include "cachegen/cuda_decoder.h"
#endif

namespace cachegen {
namespace {

// One decode: a container at `level`, or (frame) one frame into token 0.
struct Input {
  std::string what;
  std::span<const uint8_t> bytes;
  bool frame = false;
  uint32_t level = 0;
  gpu::OutputLayout layout;
  const ProfileSet* profiles = nullptr;
};

struct Outcome {
  Status status;
  std::vector<uint8_t> out;  // the output buffer (layout's bytes), 0xA5 where unwritten
};

struct Schedule {
  std::string name;
  bool may_refuse = false;  // kUnsupported = not this schedule's features
  std::function<Outcome(const Input&)> run;
};

// The CPU decoder with SIMD on or off and the transform width chosen.
Outcome RunCpu(const Input& in, bool simd_on, bool avx512) {
  simd::SetEnabled(simd_on);
  simd::SetAvx512Enabled(avx512);
  Outcome o;
  o.out = gpu_test::Buffer(in.layout);
  const gpu::OutputLayout& l = in.layout;
  const KVView view(o.out.data(), l.dtype, l.shape, l.strides, KVPaging{l.page_tokens, l.page_offsets});
  if (in.frame) {
    o.status = DecodeFrame(in.bytes, view, 1, in.profiles);
  } else {
    Result<Decoder> d = Decoder::Open(in.bytes, in.profiles);
    o.status = d.ok() ? d->Decode(view, in.level, 1) : d.status();
  }
  simd::SetEnabled(true);
  simd::SetAvx512Enabled(true);
  return o;
}

Result<gpu::Plan> PlanOf(const Input& in) {
  return in.frame ? gpu::PlanFrame(in.bytes, 0, in.layout, in.profiles)
                  : gpu::PlanContainer(in.bytes, in.level, in.layout, in.profiles);
}

Outcome RunCudaOnHost(const Input& in) {
  Outcome o;
  o.out = gpu_test::Buffer(in.layout);
  Result<gpu::Plan> plan = PlanOf(in);
  o.status = plan.ok() ? gpu::RunOnHost(*plan, in.bytes, o.out.data(), 1) : plan.status();
  return o;
}

// The device's warp intrinsics on 32 CPU threads, so that gpu::WarpGroup --
// the device's thread group -- runs here: every cooperative step (tables
// built by 32 threads, ballot-ordered renormalisation, rows split over
// lanes, barriers) as the device does it.
struct EmulatedWarp {
  struct Shared {
    std::barrier<> barrier{gpu::kGroupThreads};
    // Ballots alternate between two vote arrays, so one barrier per ballot
    // suffices: ballot n + 2 reuses n's array only after every thread has
    // passed ballot n + 1, i.e. finished reading n's.
    std::array<std::array<uint8_t, gpu::kGroupThreads>, 2> votes{};
  };
  uint32_t lane_;
  Shared* shared;
  mutable uint32_t ballots = 0;
  uint32_t lane() const { return lane_; }
  void Sync() const { shared->barrier.arrive_and_wait(); }
  uint32_t Ballot(bool v) const {
    auto& votes = shared->votes[ballots++ & 1];
    votes[lane_] = v;
    shared->barrier.arrive_and_wait();
    uint32_t mask = 0;
    for (uint32_t k = 0; k < gpu::kGroupThreads; ++k) mask |= uint32_t{votes[k]} << k;
    return mask;
  }
};

Status RunEmulatedWarps(const gpu::Plan& plan, std::span<const uint8_t> input, void* dst) {
  const gpu::Inputs in = gpu::HostInputs(plan, input, dst);
  std::vector<float> buffer(gpu::WorkspaceBytes(plan.max_head_dim) / sizeof(float));
  const gpu::Workspace w = gpu::CarveWorkspace(reinterpret_cast<uint8_t*>(buffer.data()), plan.max_head_dim);
  for (const gpu::JobDesc& job : plan.jobs) {
    EmulatedWarp::Shared shared;
    std::array<uint32_t, gpu::kGroupThreads> codes{};
    std::vector<std::thread> threads;
    for (uint32_t lane = 0; lane < gpu::kGroupThreads; ++lane)
      threads.emplace_back([&, lane] {
        gpu::WarpGroup<EmulatedWarp> g{EmulatedWarp{lane, &shared}};
        gpu::JobRunner<gpu::WarpGroup<EmulatedWarp>> runner(g, job, in, w);
        codes[lane] = runner.Run();
      });
    for (std::thread& t : threads) t.join();
    for (uint32_t c : codes)
      if (c != codes[0]) return Status::Internal("the threads of a warp disagree on the outcome");
    CG_RETURN_IF_ERROR(gpu::JobStatus(job, codes[0]));
  }
  return Status::Ok();
}

// Plans of more jobs than this run on the emulated warp only in part of the
// inputs (32 threads per job): the first dtype of each valid input.
constexpr size_t kMaxEmulatedJobs = 96;

Outcome RunCudaEmulated(const Input& in) {
  Outcome o;
  o.out = gpu_test::Buffer(in.layout);
  Result<gpu::Plan> plan = PlanOf(in);
  if (!plan.ok()) {
    o.status = plan.status();
    return o;
  }
  if (plan->jobs.size() > kMaxEmulatedJobs) {
    o.status = Status::Unsupported("too many jobs to emulate");
    return o;
  }
  o.status = RunEmulatedWarps(*plan, in.bytes, o.out.data());
  return o;
}

#if defined(CACHEGEN_PARITY_CUDA_DEVICE)
Outcome RunCudaDevice(const Input& in) {
  Outcome o;
  o.out = gpu_test::Buffer(in.layout);
  static Result<std::unique_ptr<cuda::Decoder>> dec = cuda::Decoder::Create();
  if (!dec.ok()) {
    o.status = dec.status();
    return o;
  }
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, o.out.size()) != cudaSuccess) {
    o.status = Status::Internal("cudaMalloc failed");
    return o;
  }
  cudaMemcpy(ptr, o.out.data(), o.out.size(), cudaMemcpyHostToDevice);
  const cuda::DeviceKV kv{ptr, in.layout};
  if (in.frame) {
    o.status = (*dec)->PrepareFrame(in.bytes, 0, kv, in.profiles);
    if (o.status.ok()) o.status = (*dec)->Run();
  } else {
    o.status = (*dec)->Decode(in.bytes, in.level, kv, in.profiles);
  }
  cudaMemcpy(o.out.data(), ptr, o.out.size(), cudaMemcpyDeviceToHost);
  cudaFree(ptr);
  return o;
}
#endif

std::vector<Schedule> Schedules() {
  std::vector<Schedule> s;
  if (simd::Avx2()) {
    s.push_back({"cpu-avx2", false, [](const Input& in) { return RunCpu(in, true, false); }});
    if (simd::Avx512()) s.push_back({"cpu-avx512", false, [](const Input& in) { return RunCpu(in, true, true); }});
  }
  s.push_back({"cuda-host", true, RunCudaOnHost});
  s.push_back({"cuda-emulated-warp", true, RunCudaEmulated});
#if defined(CACHEGEN_PARITY_CUDA_DEVICE)
  if (cuda::DeviceStatus().ok()) s.push_back({"cuda-device", true, RunCudaDevice});
#endif
  return s;
}

// What the schedules did with the inputs of one case.
struct Tally {
  uint64_t compared = 0, refused = 0, fused_batches = 0;
};

// Runs every schedule on `in` against the reference, whose verdict goes to
// `reference` (when given); `cuda_takes`: whether the CUDA schedules must
// take it (else they may refuse with kUnsupported).
void CheckInput(const Input& in, bool cuda_takes, bool emulate, std::map<std::string, Tally>* tally,
                Status* reference = nullptr) {
  const Outcome want = RunCpu(in, false, false);
  if (reference) *reference = want.status;
  for (const Schedule& s : Schedules()) {
    if (s.name == "cuda-emulated-warp" && !emulate) continue;
    const uint64_t fused0 = internal::FusedBatchesOnThisThread();
    const Outcome got = s.run(in);
    Tally& t = (*tally)[s.name];
    t.fused_batches += internal::FusedBatchesOnThisThread() - fused0;
    if (s.may_refuse && got.status.code() == StatusCode::kUnsupported) {
      const bool too_big = got.status.message() == "too many jobs to emulate";
      EXPECT_TRUE(!cuda_takes || too_big) << s.name << " refused " << in.what << ": " << got.status.ToString();
      ++t.refused;
      continue;
    }
    ++t.compared;
    ASSERT_EQ(want.status.ok(), got.status.ok())
        << s.name << " on " << in.what << ": reference " << want.status.ToString() << ", got "
        << got.status.ToString();
    if (want.status.ok()) {
      EXPECT_EQ(gpu_test::FirstDifference(want.out, got.out), "") << s.name << " on " << in.what;
    }
  }
}

// A case: the KV, the codec settings, how a profile is learned (when it is).
struct Case {
  std::string name;
  KVShape shape;
  CodecConfig cfg;
  bool profile = false;
  ProfileTrainOptions train;
  gpu_test::Layout layout = gpu_test::Layout::kContiguous;
  bool zeros = false;
  uint32_t token_start = 0;
  bool expect_fused = false;  // the fused schedule must take some of its batches
};

Case Make(std::string name, KVShape shape, CodecConfig cfg) {
  Case c;
  c.name = std::move(name);
  c.shape = shape;
  c.cfg = std::move(cfg);
  return c;
}

CodecConfig Cfg(double bits, uint32_t chunk, uint32_t group = 0) {
  CodecConfig c;
  c.bits_per_value = bits;
  c.chunk_tokens = chunk;
  c.group_tokens = group;
  c.threads = 1;
  return c;
}

RopeConfig Rope(RopeConfig::Kind kind, uint32_t dims) {
  RopeConfig r;
  r.kind = kind;
  r.dims = dims;
  return r;
}

// Profile-free frames: each feature of the section format on and off.
std::vector<Case> ProfileFreeCases() {
  using K = RopeConfig::Kind;
  std::vector<Case> v;
  const KVShape s{2, 3, 64, 41};
  v.push_back(Make("default", s, Cfg(2, 32)));
  v.back().expect_fused = true;
  v.push_back(Make("no_deltas", {1, 8, 32, 30}, Cfg(3, 0, 1)));
  v.back().expect_fused = true;
  v.push_back(Make("groups3", {1, 5, 32, 43}, Cfg(3, 0, 3)));
  v.back().expect_fused = true;
  v.push_back(Make("rotate_g4", {1, 3, 64, 41}, Cfg(3, 0, 4)));
  v.back().cfg.rotate = true;
  Case esc = Make("escapes", {1, 2, 16, 40}, Cfg(0, 40));
  esc.cfg.max_rel_error = 0.0005;
  v.push_back(esc);
  v.push_back(Make("one_token_chunks", {1, 2, 16, 5}, Cfg(3, 1)));
  for (K kind : {K::kNormal, K::kNeox})
    for (uint32_t dims : {64u, 40u, 12u}) {
      Case c = Make(std::string(kind == K::kNeox ? "neox" : "normal") + std::to_string(dims), s, Cfg(3, 16));
      c.cfg.rope = Rope(kind, dims);
      c.token_start = 700;
      c.expect_fused = dims != 12;
      v.push_back(c);
    }
  for (double r : {0.5, 0.0}) {
    Case c = Make(std::string("recent_") + (r == 0 ? "exact" : "half"), {1, 4, 32, 45}, Cfg(2, 0, 3));
    c.cfg.rope = Rope(K::kNormal, 32);
    c.cfg.recent_tokens = 9;
    c.cfg.recent_step_scale = r;
    v.push_back(c);
  }
  Case levels = Make("levels3", s, Cfg(4, 32));
  levels.cfg.levels = 3;
  v.push_back(levels);
  v.push_back(Make("padded_rows", s, Cfg(2, 32)));
  v.back().layout = gpu_test::Layout::kPadded;
  v.push_back(Make("paged", {2, 2, 32, 70}, Cfg(2, 32, 2)));
  v.back().layout = gpu_test::Layout::kPaged;
  v.back().cfg.rotate = true;
  Case zeros = Make("zeros", s, Cfg(2, 32));
  zeros.zeros = true;
  v.push_back(zeros);
  return v;
}

// Frames coded with a model profile: the default quality path (`profile
// train`'s defaults: lloyd codebooks, key transforms, key channel classes,
// RoPE) and each of its features off in turn, value transforms and classes.
std::vector<Case> ProfileCases() {
  using K = RopeConfig::Kind;
  std::vector<Case> v;
  const KVShape s{2, 3, 64, 128};
  auto add = [&](std::string name, bool lloyd, bool kt, bool kc, bool vt, bool vc, RopeConfig rope, uint32_t g,
                 bool fused) {
    Case c = Make(std::move(name), s, Cfg(3, 64, g));
    c.profile = true;
    c.cfg.quantizer = lloyd ? CodecConfig::Quantizer::kLloyd : CodecConfig::Quantizer::kUniform;
    c.cfg.rope = rope;
    c.train.key_transform = kt;
    c.train.key_channel_classes = kc;
    c.train.value_transform = vt;
    c.train.value_channel_classes = vc;
    c.token_start = 256;
    c.expect_fused = fused;
    v.push_back(std::move(c));
  };
  add("quality_default", true, true, true, false, false, Rope(K::kNormal, 64), 0, true);
  add("quality_neox_partial", true, true, true, false, false, Rope(K::kNeox, 40), 0, true);
  add("uniform", false, true, true, false, false, Rope(K::kNormal, 64), 0, true);
  add("no_key_transform_no_rope", true, false, true, false, false, {}, 0, true);
  add("no_key_classes", true, true, false, false, false, Rope(K::kNormal, 64), 0, true);
  add("value_transform_classes", true, true, true, true, true, Rope(K::kNeox, 64), 3, true);
  add("profile_no_deltas", true, true, true, true, false, {}, 1, true);
  add("tables_only_rope", false, false, false, false, false, Rope(K::kNormal, 64), 0, false);
  return v;
}

KVTensor CaseKV(const Case& c, uint32_t tokens, uint32_t token_start, uint64_t seed) {
  KVShape shape = c.shape;
  shape.tokens = tokens;
  if (c.zeros) return KVTensor(shape, DType::kF16);
  SyntheticOptions o;
  o.token_start = token_start;
  o.rope = c.cfg.rope.kind != RopeConfig::Kind::kNone;
  auto kv = SyntheticKV(shape, DType::kF16, seed, o);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  return kv.ok() ? std::move(*kv) : KVTensor(shape, DType::kF16);
}

// The case's container (and its profile, learned from other tokens of the
// same synthetic model).
struct Encoded {
  std::vector<uint8_t> container;
  std::shared_ptr<ProfileSet> profiles = std::make_shared<ProfileSet>();
};

Encoded EncodeCase(const Case& c) {
  Encoded e;
  CodecConfig cfg = c.cfg;
  if (c.profile) {
    const KVTensor train = CaseKV(c, 256, 0, 77);
    const KVView views[] = {train.view()};
    auto p = Profile::Train(views, cfg, c.train);
    EXPECT_TRUE(p.ok()) << c.name << ": " << p.status().ToString();
    if (!p.ok()) return e;
    cfg.profile = *p;
    e.profiles->Add(*p);
  }
  const KVTensor kv = CaseKV(c, c.shape.tokens, c.token_start, c.profile ? 78 : 7);
  auto bytes = Encoder::Create(cfg)->Encode(kv.view(), nullptr, c.token_start);
  EXPECT_TRUE(bytes.ok()) << c.name << ": " << bytes.status().ToString();
  if (bytes.ok()) e.container = std::move(*bytes);
  return e;
}

gpu::OutputLayout LayoutOf(const Case& c, DType dtype) {
  gpu_test::GpuCase g{c.name, c.shape, c.cfg, dtype, c.layout};
  return gpu_test::CaseLayout(g);
}

void PrintTally(const std::string& what, const std::map<std::string, Tally>& tally) {
  std::string line = what + ":";
  for (const auto& [name, t] : tally)
    line += " " + name + " compared " + std::to_string(t.compared) + ", refused " + std::to_string(t.refused) + ";";
  std::printf("%s\n", line.c_str());
}

// Every valid input of a case in every output dtype and at every level.
void CheckValidCase(const Case& c) {
  const Encoded e = EncodeCase(c);
  ASSERT_FALSE(e.container.empty()) << c.name;
  auto d = Decoder::Open(e.container, e.profiles.get());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::map<std::string, Tally> tally;
  bool first = true;
  for (uint32_t level = 0; level < d->info().levels; ++level)
    for (DType dt : {DType::kF16, DType::kF32, DType::kBF16}) {
      Input in{c.name + " level " + std::to_string(level) + " " + DTypeName(dt), e.container, false, level,
               LayoutOf(c, dt), e.profiles.get()};
      Status ref;
      CheckInput(in, /*cuda_takes=*/true, /*emulate=*/first, &tally, &ref);
      ASSERT_TRUE(ref.ok()) << in.what << ": " << ref.ToString();
      first = false;
    }
  if (c.expect_fused && simd::Avx2()) {
    EXPECT_GT(tally["cpu-avx2"].fused_batches, 0u) << c.name;
  }
  PrintTally(c.name, tally);
}

class ScheduleParity : public testing::TestWithParam<Case> {
 protected:
  void TearDown() override {
    simd::SetEnabled(true);
    simd::SetAvx512Enabled(true);
  }
};

TEST_P(ScheduleParity, EverySchedulePrintsTheReferenceBytes) { CheckValidCase(GetParam()); }

std::vector<Case> AllCases() {
  std::vector<Case> v = ProfileFreeCases();
  for (Case& c : ProfileCases()) v.push_back(std::move(c));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, ScheduleParity, testing::ValuesIn(AllCases()),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

// The GPU cases (gpu_cases.h: bit widths, group sizes with and without
// rotation, odd shapes, head dims 6 to 256, RoPE, layouts) through every
// schedule: the CUDA schedules take all of them.
TEST(ScheduleParityGpuCases, EveryScheduleMatches) {
  for (const gpu_test::GpuCase& g : gpu_test::GpuCases()) {
    const std::vector<uint8_t> container = gpu_test::EncodeCase(g);
    ASSERT_FALSE(container.empty()) << g.name;
    auto d = Decoder::Open(container);
    ASSERT_TRUE(d.ok());
    std::map<std::string, Tally> tally;
    for (uint32_t level = 0; level < d->info().levels; ++level) {
      const Input in{g.name + " level " + std::to_string(level), container, false, level, gpu_test::CaseLayout(g)};
      CheckInput(in, /*cuda_takes=*/true, /*emulate=*/g.emulate && level == 0, &tally);
    }
  }
}

// Hostile frames: one payload byte changed in a section, checksums
// recomputed (so the frame parses and each schedule's stream validation
// decides). Every schedule reaches the reference's verdict and, where it
// accepts, writes its bytes.
TEST(ScheduleParityHostile, ChangedPayloadBytesGetTheReferenceVerdict) {
  std::mt19937_64 rng(5);
  std::vector<Case> cases = {ProfileFreeCases()[0], ProfileFreeCases()[3], ProfileCases()[0], ProfileCases()[5]};
  cases[0].shape.tokens = cases[1].shape.tokens = 24;
  cases[0].cfg.chunk_tokens = cases[1].cfg.chunk_tokens = 0;
  for (Case& c : cases) c.shape.layers = 1;
  for (const Case& c : cases) {
    const Encoded e = EncodeCase(c);
    auto d = Decoder::Open(e.container, e.profiles.get());
    ASSERT_TRUE(d.ok());
    const std::vector<uint8_t> frame(d->Frame(0, 0)->begin(), d->Frame(0, 0)->end());
    const gpu_test::FrameParts parts = gpu_test::SplitFrame(frame);
    const std::vector<EncodedSection>& sections = parts.sections;
    std::map<std::string, Tally> tally;
    int rejected = 0;
    for (int variant = 0; variant < 48; ++variant) {
      std::vector<EncodedSection> changed = sections;
      std::vector<uint8_t>& payload = changed[rng() % changed.size()].bytes;
      if (payload.empty()) continue;
      payload[rng() % payload.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      const std::vector<uint8_t> bad = WriteFrame(parts.header, changed);
      KVShape shape = c.shape;
      shape.tokens = parts.header.shape.tokens;
      const Input in{c.name + " variant " + std::to_string(variant), bad, true, 0,
                     gpu::ContiguousLayout(shape, DType::kF16), e.profiles.get()};
      Status ref;
      CheckInput(in, /*cuda_takes=*/true, /*emulate=*/variant % 8 == 0, &tally, &ref);
      rejected += !ref.ok();
    }
    EXPECT_GT(rejected, 0) << c.name;
    PrintTally(c.name + " (hostile)", tally);
  }
}

// The decode fuzzer's corpus (tests/fuzz/corpus/decode_fuzz: the inputs its
// runs kept for new coverage -- mostly hostile bytes with recomputed
// checksums, valid containers and frames of every codec, some of them coded
// with the fuzzer's model profiles), each as a container and as a frame:
// every schedule reaches the reference's verdict and, where it accepts,
// writes its bytes.
TEST(ScheduleParityFuzzCorpus, EveryInputGetsTheReferenceVerdict) {
  constexpr uint64_t kMaxValues = 1u << 18;  // outputs this test allocates
  const std::filesystem::path dir = std::filesystem::path(CACHEGEN_SOURCE_DIR) / "tests/fuzz/corpus/decode_fuzz";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 20u) << dir;
  const ProfileSet* profiles = &fuzz::Profiles().set;
  std::map<std::string, Tally> tally;
  uint64_t accepted = 0, rejected = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    std::ifstream f(files[i], std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string name = files[i].filename().string();
    // A shape from the input's own header where it has one (else any: every
    // schedule must refuse it).
    KVShape container{1, 1, 1, 1}, frame{1, 1, 1, 1};
    if (auto d = Decoder::Open(bytes, profiles); d.ok()) container = d->info().shape;
    if (auto fi = InspectFrame(bytes); fi.ok()) frame = fi->shape;
    for (const bool as_frame : {false, true}) {
      const KVShape& shape = as_frame ? frame : container;
      if (shape.values() > kMaxValues) continue;
      const Input in{name + (as_frame ? " as a frame" : " as a container"), bytes, as_frame, 0,
                     gpu::ContiguousLayout(shape, DType::kF16), profiles};
      Status ref;
      CheckInput(in, /*cuda_takes=*/false, /*emulate=*/i % 4 == 0, &tally, &ref);
      (ref.ok() ? accepted : rejected) += 1;
    }
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_GT(rejected, 0u);
  PrintTally("fuzz corpus (" + std::to_string(accepted) + " accepted, " + std::to_string(rejected) + " rejected)",
             tally);
}

}  // namespace
}  // namespace cachegen
