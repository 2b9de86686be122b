// KV cache tensors: shape, element types, an owning tensor and a strided view.
//
// A KV cache is addressed as (layer, K|V, token, head, dim). Engines lay it out
// in many ways (token-major rows, layer-major blocks, V transposed, paged
// blocks); KVView describes any of them by element strides, plus an optional
// page table, so the codec can read and write engine memory without copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cachegen/status.h"

namespace cachegen {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);
Result<DType> ParseDType(std::string_view name);  // "f32", "f16", "bf16"

enum class KV : uint8_t { kKey = 0, kValue = 1 };

struct KVShape {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;

  // Channels of one token row of one layer's K (or V): kv_heads * head_dim.
  uint64_t channels() const { return uint64_t{kv_heads} * head_dim; }
  // All values: layers * 2 * tokens * channels.
  uint64_t values() const { return uint64_t{layers} * 2 * tokens * channels(); }
  bool operator==(const KVShape&) const = default;
  // Non-ok when any dimension is zero or the product would overflow limits
  // the format supports (see docs/FORMAT.md).
  Status Validate() const;
  std::string ToString() const;  // "L=32 H=8 D=128 T=1024"
};

// Element strides (in elements, not bytes) of each logical axis. Negative
// strides are not supported.
struct KVStrides {
  int64_t layer = 0;
  int64_t kv = 0;  // between K and V of the same layer
  int64_t token = 0;
  int64_t head = 0;
  int64_t dim = 0;
};

// Contiguous [layer][K|V][token][head][dim] strides for a shape.
KVStrides ContiguousStrides(const KVShape& shape);

// Optional paging: token t lives in page page_offsets[t / page_tokens] (an
// element offset from the view's base), at in-page position t % page_tokens,
// which is then multiplied by strides.token. Without paging, token offset is
// t * strides.token.
struct KVPaging {
  uint32_t page_tokens = 0;  // 0: no paging
  std::span<const int64_t> page_offsets;
};

// A non-owning view of KV memory. Copyable, cheap. The memory must outlive it.
class KVView {
 public:
  KVView() = default;
  KVView(void* base, DType dtype, KVShape shape, KVStrides strides, KVPaging paging = {})
      : base_(static_cast<uint8_t*>(base)), dtype_(dtype), shape_(shape), strides_(strides), paging_(paging) {}

  DType dtype() const { return dtype_; }
  const KVShape& shape() const { return shape_; }
  const KVStrides& strides() const { return strides_; }
  const KVPaging& paging() const { return paging_; }
  void* base() const { return base_; }

  // Element offset of (layer, kv, token, head, dim).
  int64_t Offset(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim) const {
    const uint64_t t = uint64_t{token} + token_base_;
    int64_t tok;
    if (paging_.page_tokens == 0) {
      tok = static_cast<int64_t>(t) * strides_.token;
    } else {
      tok = paging_.page_offsets[t / paging_.page_tokens] +
            static_cast<int64_t>(t % paging_.page_tokens) * strides_.token;
    }
    return int64_t{layer} * strides_.layer + int64_t{static_cast<uint8_t>(kv)} * strides_.kv + tok +
           int64_t{head} * strides_.head + int64_t{dim} * strides_.dim;
  }
  void* Pointer(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim) const {
    return base_ + Offset(layer, kv, token, head, dim) * static_cast<int64_t>(DTypeSize(dtype_));
  }

  // Reads one value as float / writes one value from float (rounded to the
  // view's dtype, round-to-nearest-even).
  float Get(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim) const;
  void Set(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim, float v) const;

  // Copies token row (layer, kv, token) — all heads and dims, channels() floats —
  // into out, or writes it from in. Fast paths for contiguous rows.
  void ReadRow(uint32_t layer, KV kv, uint32_t token, float* out) const;
  void WriteRow(uint32_t layer, KV kv, uint32_t token, const float* in) const;

  // The sub-view of tokens [begin, begin+count).
  KVView Tokens(uint32_t begin, uint32_t count) const;

 private:
  uint8_t* base_ = nullptr;
  DType dtype_ = DType::kF32;
  KVShape shape_;
  KVStrides strides_;
  KVPaging paging_;
  uint64_t token_base_ = 0;  // first token of a Tokens() sub-view
};

// An owning, contiguous [layer][K|V][token][head][dim] tensor.
class KVTensor {
 public:
  KVTensor() = default;
  KVTensor(KVShape shape, DType dtype);  // zero-filled
  // Bytes left unset, for a caller that writes every one of them before
  // anything reads the tensor (Decoder::Decode): no zero-filling pass.
  static KVTensor Unfilled(KVShape shape, DType dtype);

  const KVShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  uint8_t* data() { return data_.data(); }
  const uint8_t* data() const { return data_.data(); }
  size_t size_bytes() const { return data_.size(); }

  KVView view() { return KVView(data_.data(), dtype_, shape_, ContiguousStrides(shape_)); }
  KVView view() const {
    return KVView(const_cast<uint8_t*>(data_.data()), dtype_, shape_, ContiguousStrides(shape_));
  }

  // A copy converted to another dtype.
  KVTensor Converted(DType to) const;
  // The tensor of tokens [begin, begin+count) (a copy).
  KVTensor Slice(uint32_t begin, uint32_t count) const;

 private:
  // Tensor memory: blocks of 2 MiB or more aligned to 2 MiB and offered
  // for huge pages (kv.cc).
  static void* AllocateBytes(size_t n);
  static void FreeBytes(void* p, size_t n) noexcept;
  // std::allocator whose value-initialisation of an element is default
  // initialisation, so that a resize leaves new bytes unset (Unfilled); the
  // constructor zero-fills.
  template <typename T>
  struct UnsetAllocator : std::allocator<T> {
    UnsetAllocator() = default;
    template <typename U>
    UnsetAllocator(const UnsetAllocator<U>&) noexcept {}
    T* allocate(size_t n) { return static_cast<T*>(AllocateBytes(n * sizeof(T))); }
    void deallocate(T* p, size_t n) noexcept { FreeBytes(p, n * sizeof(T)); }
    template <typename U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };

  KVShape shape_;
  DType dtype_ = DType::kF32;
  std::vector<uint8_t, UnsetAllocator<uint8_t>> data_;
};

// Copies every value of src into dst (same shape; dtypes may differ).
Status CopyKV(const KVView& src, const KVView& dst);

// Non-ok naming the first NaN or Inf in the view, if any.
Status CheckFinite(const KVView& view);

}  // namespace cachegen
