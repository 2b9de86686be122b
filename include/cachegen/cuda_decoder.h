// The CUDA decoder of the `cachegen` codec (docs/GPU.md): decodes a
// container's frames on a GPU, many rANS streams in parallel (one warp per
// layer, K|V and head of a frame), straight into device memory in the
// layout the engine wants: f16, bf16 or f32, token-major rows with any
// strides, optionally paged. Output is bit-identical to cachegen::Decoder.
//
// Built as the `cachegen_cuda` library when CMake finds a CUDA compiler
// (option CACHEGEN_CUDA). Every header is validated on the host before the
// device sees it; the device checks the symbol data and the first failure
// comes back as a kCorrupt Status. Frames coded with a model profile decode
// given it (a ProfileSet, as for cachegen::Decoder). Features the device code
// does not implement (anything newer than this decoder) are refused with
// kUnsupported: decode those frames with cachegen::Decoder.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {
class ProfileSet;  // cachegen/profile.h
}

namespace cachegen::cuda {

// How device memory is laid out, like a KVView without its pointer: element
// strides (dim stride must be 1, none negative) and optional pages (token t
// at page_offsets[t / page_tokens] + (t % page_tokens) * strides.token).
struct DeviceLayout {
  DType dtype = DType::kF16;
  KVShape shape;  // the whole context
  KVStrides strides;
  uint32_t page_tokens = 0;  // 0: unpaged
  std::vector<int64_t> page_offsets;
  uint64_t capacity = 0;  // elements addressable from the base (checked against the layout)

  // Contiguous [layer][K|V][token][head][dim], like KVTensor.
  static DeviceLayout Contiguous(const KVShape& shape, DType dtype);
};

// Device memory to decode into.
struct DeviceKV {
  void* data = nullptr;  // device pointer
  DeviceLayout layout;
};

// Ok when device `device` can run the decoder; otherwise kUnsupported with
// the reason (no driver, no device, compute capability too old).
Status DeviceStatus(int device = 0);

class Decoder {
 public:
  static Result<std::unique_ptr<Decoder>> Create(int device = 0);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Validates the container at `level` for `out` and uploads its bytes and
  // the decode plan (with what its frames' model profile, from `profiles`,
  // supplies); Run() then decodes it (any number of times).
  Status Prepare(std::span<const uint8_t> container, uint32_t level, const DeviceKV& out,
                 const ProfileSet* profiles = nullptr);
  // The same for one frame, into tokens [dest_token, dest_token + frame tokens) of out.
  Status PrepareFrame(std::span<const uint8_t> frame, uint32_t dest_token, const DeviceKV& out,
                      const ProfileSet* profiles = nullptr);
  // Decodes what was prepared, waits, and checks every job.
  Status Run();
  // Prepare + Run.
  Status Decode(std::span<const uint8_t> container, uint32_t level, const DeviceKV& out,
                const ProfileSet* profiles = nullptr);

  // Kernel time of the last Run in milliseconds (CUDA events).
  double last_kernel_ms() const;
  // Bytes the last Prepare uploaded: the input, and the plan (jobs, tables).
  uint64_t input_bytes() const;
  uint64_t plan_bytes() const;

 private:
  struct Impl;
  explicit Decoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cachegen::cuda
