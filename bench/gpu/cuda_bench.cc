// cachegen_cuda_bench: decode speed of the CUDA decoder on a Llama-3-8B-shaped
// context (32 layers x 8 KV heads x 128 dims x 4096 tokens by default),
// synthetic KV (src/kv/synthetic.h), default codec settings, or with
// --profile the default quality path (a model profile trained as `profile
// train` trains it, on another synthetic context of the same shape: lloyd
// codebooks, key transforms, key channel classes, RoPE undone). Reports the
// median kernel time over --reps runs as GB/s of f16 output, next to
// cudaMemcpy device-to-device of the same bytes and the CPU decoder, all in
// the same run; checks the device output against the CPU decoder's bytes.
//
// Exit status: 0 ok, 1 failure (including a mismatch), 2 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/cuda_decoder.h"
#include "cachegen/profile.h"
#include "common/parallel.h"
#include "kv/synthetic.h"

namespace {

using cachegen::Status;

struct Options {
  cachegen::KVShape shape{32, 8, 128, 4096};
  double bits = 0;  // 0: the codec's default target
  uint32_t chunk = 0;  // 0: the codec's default
  int reps = 20;
  bool verify = true;
  bool check_device = false;
  bool profile = false;
};

void Usage() {
  std::printf(
      "usage: cachegen_cuda_bench [--layers N] [--heads N] [--dim N] [--tokens N] [--bits B] [--chunk T]\n"
      "                           [--reps N] [--profile] [--no-verify] [--check-device]\n"
      "Decode GB/s (f16 output) of the CUDA decoder vs cudaMemcpy device-to-device, medians over reps.\n"
      "Exit 0 ok, 1 failure, 2 no CUDA device.\n");
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](double* v) {
      if (i + 1 >= argc) return false;
      *v = std::atof(argv[++i]);
      return true;
    };
    double v = 0;
    if (a == "--no-verify") {
      o->verify = false;
    } else if (a == "--check-device") {
      o->check_device = true;
    } else if (a == "--profile") {
      o->profile = true;
    } else if (a == "--layers" && next(&v)) {
      o->shape.layers = static_cast<uint32_t>(v);
    } else if (a == "--heads" && next(&v)) {
      o->shape.kv_heads = static_cast<uint32_t>(v);
    } else if (a == "--dim" && next(&v)) {
      o->shape.head_dim = static_cast<uint32_t>(v);
    } else if (a == "--tokens" && next(&v)) {
      o->shape.tokens = static_cast<uint32_t>(v);
    } else if (a == "--bits" && next(&v)) {
      o->bits = v;
    } else if (a == "--chunk" && next(&v)) {
      o->chunk = static_cast<uint32_t>(v);
    } else if (a == "--reps" && next(&v)) {
      o->reps = std::max(1, static_cast<int>(v));
    } else {
      return false;
    }
  }
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "cachegen_cuda_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int FailCuda(const char* what, cudaError_t e) {
  std::fprintf(stderr, "cachegen_cuda_bench: %s: %s\n", what, cudaGetErrorString(e));
  return 1;
}

// Median milliseconds of cudaMemcpy device-to-device of `bytes`.
int MemcpyMs(void* dst, const void* src, size_t bytes, int reps, double* ms) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    cudaEventRecord(a);
    if (cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice); e != cudaSuccess)
      return FailCuda("cudaMemcpy", e);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float f = 0;
    cudaEventElapsedTime(&f, a, b);
    if (r > 0) t.push_back(f);  // the first is a warm-up
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  *ms = Median(t);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    Usage();
    return 1;
  }
  if (Status s = cachegen::cuda::DeviceStatus(); !s.ok()) {
    std::printf("no CUDA device: %s\n", s.ToString().c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s (compute %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (o.check_device) return 0;

  const cachegen::KVShape& shape = o.shape;
  std::printf("shape: %s\n", shape.ToString().c_str());
  auto t0 = std::chrono::steady_clock::now();
  auto kv = cachegen::SyntheticKV(shape, cachegen::DType::kF16, 1);
  if (!kv.ok()) return Fail("synthetic KV", kv.status());
  std::printf("synthetic KV: %.1f s\n", Seconds(t0));

  cachegen::CodecConfig cfg;  // default codec settings
  if (o.bits > 0) cfg.bits_per_value = o.bits;
  if (o.chunk > 0) cfg.chunk_tokens = o.chunk;
  cachegen::ProfileSet profiles;
  if (o.profile) {
    cfg.rope.kind = cachegen::RopeConfig::Kind::kNormal;  // the synthetic keys' RoPE, undone
    cfg.quantizer = cachegen::CodecConfig::Quantizer::kLloyd;
    t0 = std::chrono::steady_clock::now();
    cachegen::KVShape train_shape = shape;
    train_shape.tokens = std::min<uint32_t>(shape.tokens, 1024);
    auto train = cachegen::SyntheticKV(train_shape, cachegen::DType::kF16, 2);
    if (!train.ok()) return Fail("synthetic KV", train.status());
    const cachegen::KVView views[] = {train->view()};
    auto p = cachegen::Profile::Train(views, cfg);
    if (!p.ok()) return Fail("profile", p.status());
    cfg.profile = *p;
    profiles.Add(*p);
    std::printf("profile (lloyd, key transforms and classes, RoPE undone): trained in %.1f s\n", Seconds(t0));
  }
  auto enc = cachegen::Encoder::Create(cfg);
  if (!enc.ok()) return Fail("encoder", enc.status());
  t0 = std::chrono::steady_clock::now();
  cachegen::EncodeStats stats;
  auto container = enc->Encode(kv->view(), &stats);
  if (!container.ok()) return Fail("encode", container.status());
  const size_t out_bytes = shape.values() * 2;
  std::printf("encoded: %zu bytes (%.3f bits/value, chunk %u tokens) in %.1f s\n", container->size(),
              8.0 * container->size() / shape.values(), cfg.chunk_tokens, Seconds(t0));

  void* out = nullptr;
  void* copy = nullptr;
  if (cudaError_t e = cudaMalloc(&out, out_bytes); e != cudaSuccess) return FailCuda("cudaMalloc", e);
  if (cudaError_t e = cudaMalloc(&copy, out_bytes); e != cudaSuccess) return FailCuda("cudaMalloc", e);
  auto dec = cachegen::cuda::Decoder::Create();
  if (!dec.ok()) return Fail("CUDA decoder", dec.status());
  t0 = std::chrono::steady_clock::now();
  const cachegen::cuda::DeviceKV view{out, cachegen::cuda::DeviceLayout::Contiguous(shape, cachegen::DType::kF16)};
  if (Status s = (*dec)->Prepare(*container, 0, view, &profiles); !s.ok()) return Fail("prepare", s);
  std::printf("prepare (plan + upload): %.1f ms, plan %.2f MB\n", 1e3 * Seconds(t0), (*dec)->plan_bytes() / 1e6);

  std::vector<double> kernel_ms;
  for (int r = 0; r < o.reps + 1; ++r) {
    if (Status s = (*dec)->Run(); !s.ok()) return Fail("decode", s);
    if (r > 0) kernel_ms.push_back((*dec)->last_kernel_ms());  // the first is a warm-up
  }
  double memcpy_ms = 0;
  if (int rc = MemcpyMs(copy, out, out_bytes, o.reps, &memcpy_ms); rc != 0) return rc;

  // The CPU decoder, all cores, same container (median of a few runs).
  std::vector<double> cpu_s;
  cachegen::KVTensor cpu_out;
  auto cpu_dec = cachegen::Decoder::Open(*container, &profiles);
  if (!cpu_dec.ok()) return Fail("CPU decoder", cpu_dec.status());
  for (int r = 0; r < 3; ++r) {
    t0 = std::chrono::steady_clock::now();
    auto t = cpu_dec->Decode(cachegen::DType::kF16, 0, 0);
    if (!t.ok()) return Fail("CPU decode", t.status());
    cpu_s.push_back(Seconds(t0));
    cpu_out = std::move(*t);
  }

  const double k = Median(kernel_ms);
  std::printf("CUDA decode: %.3f ms median of %d runs = %.1f GB/s of f16 output (min %.3f ms, max %.3f ms)\n", k,
              o.reps, out_bytes / (k * 1e6), *std::min_element(kernel_ms.begin(), kernel_ms.end()),
              *std::max_element(kernel_ms.begin(), kernel_ms.end()));
  std::printf("cudaMemcpy D2D of the same %zu bytes: %.3f ms median = %.1f GB/s copied\n", out_bytes, memcpy_ms,
              out_bytes / (memcpy_ms * 1e6));
  std::printf("decode / memcpy time: %.2f\n", k / memcpy_ms);
  std::printf("CPU decoder (%u threads): %.1f ms median of 3 = %.2f GB/s of f16 output\n",
              cachegen::ResolveThreads(0), 1e3 * Median(cpu_s), out_bytes / (Median(cpu_s) * 1e9));

  if (o.verify) {
    std::vector<uint8_t> got(out_bytes);
    if (cudaError_t e = cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost); e != cudaSuccess)
      return FailCuda("download", e);
    if (std::memcmp(got.data(), cpu_out.data(), out_bytes) != 0) {
      std::printf("MISMATCH: device output differs from the CPU decoder's\n");
      return 1;
    }
    std::printf("device output bit-identical to the CPU decoder's\n");
  }
  cudaFree(out);
  cudaFree(copy);
  return 0;
}
