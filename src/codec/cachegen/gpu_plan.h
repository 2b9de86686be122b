// The host side of the CUDA decoder for the `cachegen` codec: a *plan* turns
// a container (or one frame) into flat arrays of jobs (gpu_core.h), one per
// (frame, layer, K|V, head), after validating every header with the same
// parsers the CPU decoder uses. The device trusts the layout a plan gives
// (offsets, sizes, destination) and checks only the symbol data, which a
// plan cannot validate without decoding it.
//
// RunOnHost executes a plan's jobs with the exact device code on the CPU:
// the tests compare it byte for byte with cachegen::Decoder, and the CUDA
// decoder (src/cuda/) runs the same jobs on a GPU.
//
// A frame coded with a model profile needs it in `profiles` (kNotFound, as on
// the CPU); the plan resolves what the profile supplies (channel statistics,
// decode tables, codebook levels, head transforms) into flat arrays.
//
// What a plan refuses with kUnsupported (a whitelist, so that features added
// to the format later are refused until implemented here): codecs other
// than `cachegen`, cachegen params flags or section flags this decoder does
// not know, params versions above 2.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachegen/cuda_decoder.h"
#include "cachegen/kv.h"
#include "cachegen/profile.h"
#include "cachegen/status.h"
#include "codec/cachegen/gpu_core.h"

namespace cachegen::gpu {

// The destination of a decode (the memory may be on a device).
using OutputLayout = cuda::DeviceLayout;

// A contiguous [layer][K|V][token][head][dim] layout of a shape (KVTensor's).
inline OutputLayout ContiguousLayout(const KVShape& shape, DType dtype) {
  return cuda::DeviceLayout::Contiguous(shape, dtype);
}

struct Plan {
  std::vector<JobDesc> jobs;
  std::vector<uint16_t> freqs;     // frequency tables of the rANS streams
  std::vector<float> sigma_table;  // 256 scales by code (section_coder's)
  std::vector<float> rope;         // per frame with RoPE: cos[tokens][pairs], then sin
  std::vector<float> values;       // profile statistics, codebook levels, head transforms (Inputs::values)
  std::vector<uint32_t> indices;   // table cycles, codebook level offsets (Inputs::indices)
  std::vector<uint32_t> tables;    // profile decode tables, kTableWords each (Inputs::tables)
  std::vector<int64_t> pages;
  DestDesc dest;
  uint32_t max_head_dim = 0;
  uint64_t input_bytes = 0;     // the input the offsets refer to
  uint64_t output_values = 0;   // values the jobs write
};

// Every chunk of a container at `level` into `out` (shape = the container's).
Result<Plan> PlanContainer(std::span<const uint8_t> container, uint32_t level, const OutputLayout& out,
                           const ProfileSet* profiles = nullptr);
// One frame into tokens [dest_token, dest_token + frame tokens) of `out`.
Result<Plan> PlanFrame(std::span<const uint8_t> frame, uint32_t dest_token, const OutputLayout& out,
                       const ProfileSet* profiles = nullptr);

// The error of job `job` that returned `code` (JobError plus the stream
// number << 8), as a kCorrupt Status naming layer, K|V and head.
Status JobStatus(const JobDesc& job, uint32_t code);

// The device code's inputs for a plan whose arrays stay in host memory.
Inputs HostInputs(const Plan& plan, std::span<const uint8_t> input, void* dst);

// Runs every job of `plan` on the CPU with the device code, writing into
// `dst` (the base of memory laid out as the plan's OutputLayout). `input`
// must be the bytes the plan was made from.
Status RunOnHost(const Plan& plan, std::span<const uint8_t> input, void* dst, uint32_t threads = 1);

}  // namespace cachegen::gpu
