#include "cachegen/kv.h"

#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "common/convert.h"
#include "common/half.h"

namespace cachegen {

size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  return Status::InvalidArgument("unknown dtype '" + std::string(name) + "' (known: f32, f16, bf16)");
}

Status KVShape::Validate() const {
  if (layers == 0 || kv_heads == 0 || head_dim == 0 || tokens == 0)
    return Status::InvalidArgument("KV shape has a zero dimension: " + ToString());
  // Limits of the format (docs/FORMAT.md): keep every section under 2^32 bytes
  // of f32 and every count representable.
  if (layers > 4096 || kv_heads > 4096 || head_dim > 4096 || channels() > 65536)
    return Status::InvalidArgument("KV shape exceeds format limits: " + ToString());
  if (uint64_t{tokens} * channels() > (uint64_t{1} << 30))
    return Status::InvalidArgument("KV section too large (tokens x channels > 2^30): " + ToString());
  return Status::Ok();
}

std::string KVShape::ToString() const {
  return "L=" + std::to_string(layers) + " H=" + std::to_string(kv_heads) + " D=" + std::to_string(head_dim) +
         " T=" + std::to_string(tokens);
}

KVStrides ContiguousStrides(const KVShape& s) {
  KVStrides st;
  st.dim = 1;
  st.head = s.head_dim;
  st.token = static_cast<int64_t>(s.channels());
  st.kv = st.token * s.tokens;
  st.layer = st.kv * 2;
  return st;
}

namespace {

inline float LoadAs(const uint8_t* p, DType t) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return F16ToF32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BF16ToF32(h);
    }
  }
  return 0;
}

inline void StoreAs(uint8_t* p, DType t, float v) {
  switch (t) {
    case DType::kF32: std::memcpy(p, &v, 4); return;
    case DType::kF16: {
      const uint16_t h = F32ToF16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kBF16: {
      const uint16_t h = F32ToBF16(v);
      std::memcpy(p, &h, 2);
      return;
    }
  }
}

}  // namespace

float KVView::Get(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim) const {
  return LoadAs(static_cast<const uint8_t*>(Pointer(layer, kv, token, head, dim)), dtype_);
}

void KVView::Set(uint32_t layer, KV kv, uint32_t token, uint32_t head, uint32_t dim, float v) const {
  StoreAs(static_cast<uint8_t*>(Pointer(layer, kv, token, head, dim)), dtype_, v);
}

void KVView::ReadRow(uint32_t layer, KV kv, uint32_t token, float* out) const {
  const uint32_t H = shape_.kv_heads, D = shape_.head_dim;
  const size_t esize = DTypeSize(dtype_);
  for (uint32_t h = 0; h < H; ++h) {
    const auto* p = static_cast<const uint8_t*>(Pointer(layer, kv, token, h, 0));
    float* o = out + size_t{h} * D;
    if (strides_.dim == 1) {
      LoadRow(dtype_, p, D, o);
    } else {
      const int64_t step = strides_.dim * static_cast<int64_t>(esize);
      for (uint32_t d = 0; d < D; ++d) o[d] = LoadAs(p + step * d, dtype_);
    }
  }
}

void KVView::WriteRow(uint32_t layer, KV kv, uint32_t token, const float* in) const {
  const uint32_t H = shape_.kv_heads, D = shape_.head_dim;
  const size_t esize = DTypeSize(dtype_);
  for (uint32_t h = 0; h < H; ++h) {
    auto* p = static_cast<uint8_t*>(Pointer(layer, kv, token, h, 0));
    const float* src = in + size_t{h} * D;
    if (strides_.dim == 1) {
      StoreRow(dtype_, src, D, p);
    } else {
      const int64_t step = strides_.dim * static_cast<int64_t>(esize);
      for (uint32_t d = 0; d < D; ++d) StoreAs(p + step * d, dtype_, src[d]);
    }
  }
}

KVView KVView::Tokens(uint32_t begin, uint32_t count) const {
  KVView v = *this;
  v.shape_.tokens = count;
  v.token_base_ = token_base_ + begin;
  return v;
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

// A chunk's tensor is mostly written once into memory the process has not
// touched yet (a decode target, a conversion): with 4 KiB pages the page
// faults cost more than the decode. On the 2-core VM a new 8 MiB tensor
// took 22-24 ms to fault in, against 3.4 ms to decode a chunk into it;
// aligned to 2 MiB and marked for transparent huge pages, 0.9-16 ms (an
// mmap'd range so marked: 0.3-1.4 ms). The mark is advice: where huge
// pages are off (or always on) nothing changes.
void* KVTensor::AllocateBytes(size_t n) {
  if (n < kHugePage) return ::operator new(n);
  void* p = ::operator new(n, std::align_val_t{kHugePage});
#ifdef MADV_HUGEPAGE
  (void)madvise(p, n, MADV_HUGEPAGE);
#endif
  return p;
}

void KVTensor::FreeBytes(void* p, size_t n) noexcept {
  if (n < kHugePage) ::operator delete(p);
  else ::operator delete(p, std::align_val_t{kHugePage});
}

KVTensor::KVTensor(KVShape shape, DType dtype)
    : shape_(shape), dtype_(dtype), data_(shape.values() * DTypeSize(dtype), uint8_t{0}) {}

KVTensor KVTensor::Unfilled(KVShape shape, DType dtype) {
  KVTensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.data_.resize(shape.values() * DTypeSize(dtype));
  return t;
}

KVTensor KVTensor::Converted(DType to) const {
  KVTensor out(shape_, to);
  CopyKV(view(), out.view());
  return out;
}

KVTensor KVTensor::Slice(uint32_t begin, uint32_t count) const {
  KVShape s = shape_;
  s.tokens = count;
  KVTensor out(s, dtype_);
  CopyKV(view().Tokens(begin, count), out.view());
  return out;
}

Status CopyKV(const KVView& src, const KVView& dst) {
  const KVShape& a = src.shape();
  if (!(a == dst.shape()))
    return Status::InvalidArgument("CopyKV: shape mismatch " + a.ToString() + " vs " + dst.shape().ToString());
  std::vector<float> row(a.channels());
  for (uint32_t l = 0; l < a.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < a.tokens; ++t) {
        src.ReadRow(l, kv, t, row.data());
        dst.WriteRow(l, kv, t, row.data());
      }
  return Status::Ok();
}

namespace {

// True when some of the n values at p (contiguous) is NaN or Inf: their
// exponent bits are all ones. An OR over lanes, no branch per value.
template <typename T>
bool AnyNonFinite(const uint8_t* p, uint32_t n, T exp_mask) {
  T any = 0;
  for (uint32_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + sizeof(T) * i, sizeof(T));
    any |= static_cast<T>((v & exp_mask) == exp_mask);
  }
  return any != 0;
}

bool RowHasNonFinite(const KVView& view, uint32_t l, KV kv, uint32_t t) {
  const KVShape& a = view.shape();
  for (uint32_t h = 0; h < a.kv_heads; ++h) {
    const auto* p = static_cast<const uint8_t*>(view.Pointer(l, kv, t, h, 0));
    const bool bad = view.dtype() == DType::kF32   ? AnyNonFinite<uint32_t>(p, a.head_dim, 0x7f800000u)
                     : view.dtype() == DType::kF16 ? AnyNonFinite<uint16_t>(p, a.head_dim, 0x7c00)
                                                   : AnyNonFinite<uint16_t>(p, a.head_dim, 0x7f80);
    if (bad) return true;
  }
  return false;
}

}  // namespace

Status CheckFinite(const KVView& view) {
  const KVShape& a = view.shape();
  // Contiguous dims: the raw bits are scanned, and rows are converted to
  // float only where a non-finite value is, for the message.
  const bool raw = view.strides().dim == 1;
  std::vector<float> row(a.channels());
  for (uint32_t l = 0; l < a.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < a.tokens; ++t) {
        if (raw && !RowHasNonFinite(view, l, kv, t)) continue;
        view.ReadRow(l, kv, t, row.data());
        for (size_t c = 0; c < row.size(); ++c)
          if (!std::isfinite(row[c]))
            return Status::InvalidArgument(std::string(std::isnan(row[c]) ? "NaN" : "Inf") + " in " +
                                           (kv == KV::kKey ? "K" : "V") + " at layer " + std::to_string(l) +
                                           ", token " + std::to_string(t) + ", head " +
                                           std::to_string(c / a.head_dim) + ", dim " +
                                           std::to_string(c % a.head_dim));
      }
  return Status::Ok();
}

}  // namespace cachegen
