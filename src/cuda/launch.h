// Between the CUDA decoder's host side (decoder.cc, C++20, the host compiler)
// and its device code (decoder.cu, nvcc): only plain types cross, so that
// decoder.cu needs no more than C++17 and builds with nvcc 11.8 (Debian 12's
// toolkit) as well as with newer ones.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codec/cachegen/gpu_core.h"

namespace cachegen::cuda {

// Lets the kernel use `shared_bytes` of dynamic shared memory per block (the
// opt-in maximum may exceed the default 48 KiB).
cudaError_t SetKernelSharedBytes(size_t shared_bytes);

// Queues the decode of jobs[0, n_jobs) (device memory, as `in`'s arrays) on
// `stream`: `warps_per_block` jobs per block, each warp with
// gpu::WorkspaceBytes(max_head_dim) of the block's `shared_bytes`; job k's
// gpu::JobError code goes to errors[k]. Returns the launch's error.
cudaError_t LaunchDecode(const gpu::JobDesc* jobs, uint32_t n_jobs, const gpu::Inputs& in, uint32_t max_head_dim,
                         uint32_t* errors, uint32_t warps_per_block, size_t shared_bytes, cudaStream_t stream);

}  // namespace cachegen::cuda
