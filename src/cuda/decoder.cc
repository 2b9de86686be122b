// The CUDA decoder's host side (include/cachegen/cuda_decoder.h): device
// buffers, streams and events, the plan (codec/cachegen/gpu_plan.h) uploaded
// and its jobs launched by decoder.cu (launch.h), each job's result checked.
#include "cachegen/cuda_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "codec/cachegen/gpu_core.h"
#include "codec/cachegen/gpu_plan.h"
#include "cuda/launch.h"

namespace cachegen::cuda {
namespace {

using gpu::JobDesc;

// Warps per block when shared memory allows: enough to share an SM among
// several jobs while each block stays small.
constexpr uint32_t kWarpsPerBlock = 4;

Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA decoder: ") + what + ": " + cudaGetErrorString(e));
}

#define CG_CUDA_RETURN(expr, what) CG_RETURN_IF_ERROR(CudaError((expr), (what)))

// A device buffer that grows as needed.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t size = 0;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  Status Upload(const void* src, size_t bytes, cudaStream_t stream) {
    CG_RETURN_IF_ERROR(Reserve(bytes));
    if (bytes) CG_CUDA_RETURN(cudaMemcpyAsync(ptr, src, bytes, cudaMemcpyHostToDevice, stream), "upload");
    return Status::Ok();
  }
  Status Reserve(size_t bytes) {
    if (bytes <= size && ptr) return Status::Ok();
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    size = 0;
    CG_CUDA_RETURN(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "cudaMalloc");
    size = std::max<size_t>(bytes, 16);
    return Status::Ok();
  }
  template <typename T>
  Status Upload(const std::vector<T>& v, cudaStream_t stream) {
    return Upload(v.data(), v.size() * sizeof(T), stream);
  }
};

}  // namespace

Status DeviceStatus(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return Status::Unsupported(std::string("no usable CUDA driver: ") + cudaGetErrorString(e));
  if (count == 0) return Status::Unsupported("no CUDA device present");
  if (device < 0 || device >= count)
    return Status::Unsupported("CUDA device " + std::to_string(device) + " of " + std::to_string(count) +
                               " does not exist");
  // The kernel is compiled for CMAKE_CUDA_ARCHITECTURES; a device it was not
  // built for fails the launch with "no kernel image" in Run.
  return Status::Ok();
}

struct Decoder::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  DeviceBuffer input, jobs, freqs, sigma, rope, values, indices, tables, pages, errors;
  gpu::Plan plan;
  void* dst = nullptr;
  bool prepared = false;
  double kernel_ms = 0;
  uint64_t plan_bytes = 0;
  int max_shared = 0;  // per block, opt-in

  ~Impl() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }

  Status Upload(std::span<const uint8_t> bytes, gpu::Plan p, void* out) {
    prepared = false;
    if (!out) return Status::InvalidArgument("CUDA decoder: no output memory");
    CG_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    plan = std::move(p);
    dst = out;
    CG_RETURN_IF_ERROR(input.Upload(bytes.data(), bytes.size(), stream));
    CG_RETURN_IF_ERROR(jobs.Upload(plan.jobs, stream));
    CG_RETURN_IF_ERROR(freqs.Upload(plan.freqs, stream));
    CG_RETURN_IF_ERROR(sigma.Upload(plan.sigma_table, stream));
    CG_RETURN_IF_ERROR(rope.Upload(plan.rope, stream));
    CG_RETURN_IF_ERROR(values.Upload(plan.values, stream));
    CG_RETURN_IF_ERROR(indices.Upload(plan.indices, stream));
    CG_RETURN_IF_ERROR(tables.Upload(plan.tables, stream));
    CG_RETURN_IF_ERROR(pages.Upload(plan.pages, stream));
    CG_RETURN_IF_ERROR(errors.Reserve(plan.jobs.size() * sizeof(uint32_t)));
    // The host vectors may change once this returns.
    CG_CUDA_RETURN(cudaStreamSynchronize(stream), "upload");
    plan_bytes = plan.jobs.size() * sizeof(JobDesc) + plan.freqs.size() * 2 + plan.sigma_table.size() * 4 +
                 plan.rope.size() * 4 + plan.values.size() * 4 + plan.indices.size() * 4 + plan.tables.size() * 4 +
                 plan.pages.size() * 8;
    prepared = true;
    return Status::Ok();
  }

  Status Run() {
    if (!prepared) return Status::InvalidArgument("CUDA decoder: nothing prepared");
    CG_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    const uint32_t n = static_cast<uint32_t>(plan.jobs.size());
    kernel_ms = 0;
    if (n == 0) return Status::Ok();
    const uint64_t per_warp = gpu::WorkspaceBytes(plan.max_head_dim);
    if (per_warp > static_cast<uint64_t>(max_shared))
      return Status::Unsupported("CUDA decoder: head_dim " + std::to_string(plan.max_head_dim) + " needs " +
                                 std::to_string(per_warp) + " bytes of shared memory per warp, the device has " +
                                 std::to_string(max_shared));
    const uint32_t warps = static_cast<uint32_t>(std::min<uint64_t>(kWarpsPerBlock, max_shared / per_warp));
    const size_t shared = warps * per_warp;
    CG_CUDA_RETURN(SetKernelSharedBytes(shared), "shared memory size");
    gpu::Inputs in;
    in.bytes = static_cast<const uint8_t*>(input.ptr);
    in.freqs = static_cast<const uint16_t*>(freqs.ptr);
    in.sigma_table = static_cast<const float*>(sigma.ptr);
    in.rope = static_cast<const float*>(rope.ptr);
    in.values = static_cast<const float*>(values.ptr);
    in.indices = static_cast<const uint32_t*>(indices.ptr);
    in.tables = static_cast<const uint32_t*>(tables.ptr);
    in.pages = static_cast<const int64_t*>(pages.ptr);
    in.dst = dst;
    in.dest = plan.dest;
    CG_CUDA_RETURN(cudaEventRecord(start, stream), "event");
    CG_CUDA_RETURN(LaunchDecode(static_cast<const JobDesc*>(jobs.ptr), n, in, plan.max_head_dim,
                                static_cast<uint32_t*>(errors.ptr), warps, shared, stream),
                   "kernel launch");
    CG_CUDA_RETURN(cudaEventRecord(stop, stream), "event");
    CG_CUDA_RETURN(cudaStreamSynchronize(stream), "kernel");
    float ms = 0;
    CG_CUDA_RETURN(cudaEventElapsedTime(&ms, start, stop), "event time");
    kernel_ms = ms;
    std::vector<uint32_t> codes(n);
    CG_CUDA_RETURN(cudaMemcpy(codes.data(), errors.ptr, n * sizeof(uint32_t), cudaMemcpyDeviceToHost),
                   "job status download");
    for (uint32_t k = 0; k < n; ++k)
      if (codes[k] != gpu::kJobOk) return gpu::JobStatus(plan.jobs[k], codes[k]);
    return Status::Ok();
  }
};

Decoder::Decoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Decoder::~Decoder() = default;

Result<std::unique_ptr<Decoder>> Decoder::Create(int device) {
  CG_RETURN_IF_ERROR(DeviceStatus(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  CG_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  // A blocking stream: ordered after work the caller queued on the legacy
  // default stream (e.g. what fills or allocates the output).
  CG_CUDA_RETURN(cudaStreamCreate(&impl->stream), "stream");
  CG_CUDA_RETURN(cudaEventCreate(&impl->start), "event");
  CG_CUDA_RETURN(cudaEventCreate(&impl->stop), "event");
  CG_CUDA_RETURN(cudaDeviceGetAttribute(&impl->max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                 "device attribute");
  return std::unique_ptr<Decoder>(new Decoder(std::move(impl)));
}

Status Decoder::Prepare(std::span<const uint8_t> container, uint32_t level, const DeviceKV& out,
                        const ProfileSet* profiles) {
  impl_->prepared = false;
  CG_ASSIGN_OR_RETURN(gpu::Plan plan, gpu::PlanContainer(container, level, out.layout, profiles));
  return impl_->Upload(container, std::move(plan), out.data);
}

Status Decoder::PrepareFrame(std::span<const uint8_t> frame, uint32_t dest_token, const DeviceKV& out,
                             const ProfileSet* profiles) {
  impl_->prepared = false;
  CG_ASSIGN_OR_RETURN(gpu::Plan plan, gpu::PlanFrame(frame, dest_token, out.layout, profiles));
  return impl_->Upload(frame, std::move(plan), out.data);
}

Status Decoder::Run() { return impl_->Run(); }

Status Decoder::Decode(std::span<const uint8_t> container, uint32_t level, const DeviceKV& out,
                       const ProfileSet* profiles) {
  CG_RETURN_IF_ERROR(Prepare(container, level, out, profiles));
  return Run();
}

double Decoder::last_kernel_ms() const { return impl_->kernel_ms; }
uint64_t Decoder::input_bytes() const { return impl_->plan.input_bytes; }
uint64_t Decoder::plan_bytes() const { return impl_->plan_bytes; }

}  // namespace cachegen::cuda
