// The CUDA decoder's device code (include/cachegen/cuda_decoder.h): one warp
// per job of the host plan (codec/cachegen/gpu_plan.h) running gpu_core.h's
// JobRunner with gpu_groups.h's WarpGroup -- the code schedule_parity_test runs on the CPU, with
// one thread and with an emulated warp -- the rANS lanes of a stream on the
// warp's threads, tables in shared memory. The host side is decoder.cc; this
// file needs only C++17 (launch.h), for nvcc 11.8 as well as newer ones.
#include <cuda_runtime.h>

#include "codec/cachegen/gpu_groups.h"
#include "cuda/launch.h"

namespace cachegen::cuda {
namespace {

using gpu::JobDesc;

constexpr uint32_t kFullMask = 0xffffffffu;

// Warp intrinsics for gpu::WarpGroup: the device's own.
struct DeviceWarp {
  uint32_t lane_;
  __device__ uint32_t lane() const { return lane_; }
  __device__ void Sync() const { __syncwarp(); }
  __device__ uint32_t Ballot(bool v) const { return __ballot_sync(kFullMask, v); }
};

__global__ void DecodeKernel(const JobDesc* jobs, uint32_t n_jobs, gpu::Inputs in, uint32_t max_head_dim,
                             uint32_t* errors) {
  extern __shared__ __align__(16) uint8_t shared[];
  const uint32_t warp = threadIdx.x / gpu::kGroupThreads;
  const uint32_t job = blockIdx.x * (blockDim.x / gpu::kGroupThreads) + warp;
  if (job >= n_jobs) return;  // whole warps only
  const gpu::Workspace w = gpu::CarveWorkspace(shared + warp * gpu::WorkspaceBytes(max_head_dim), max_head_dim);
  gpu::WarpGroup<DeviceWarp> g{DeviceWarp{threadIdx.x % gpu::kGroupThreads}};
  gpu::JobRunner<gpu::WarpGroup<DeviceWarp>> runner(g, jobs[job], in, w);
  const uint32_t e = runner.Run();
  if (g.tid() == 0) errors[job] = e;
}

}  // namespace

cudaError_t SetKernelSharedBytes(size_t shared_bytes) {
  return cudaFuncSetAttribute(DecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(shared_bytes));
}

cudaError_t LaunchDecode(const JobDesc* jobs, uint32_t n_jobs, const gpu::Inputs& in, uint32_t max_head_dim,
                         uint32_t* errors, uint32_t warps_per_block, size_t shared_bytes, cudaStream_t stream) {
  const uint32_t blocks = (n_jobs + warps_per_block - 1) / warps_per_block;
  DecodeKernel<<<blocks, warps_per_block * gpu::kGroupThreads, shared_bytes, stream>>>(jobs, n_jobs, in,
                                                                                        max_head_dim, errors);
  return cudaGetLastError();
}

}  // namespace cachegen::cuda
