// Shared by the binding files of the `cachegen` Python module: errors, KV
// arrays, and the registration function of each part. The module uses the
// public C++ API only (include/cachegen/), as any other consumer would.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen::python {

namespace py = pybind11;

// Raises cachegen.Error (a RuntimeError) carrying the Status message, or the
// Python exception the code maps to: ValueError for kInvalidArgument,
// KeyError-like cachegen.NotFoundError for kNotFound, OSError for kIOError.
[[noreturn]] void Raise(const Status& status);
inline void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}
template <typename T>
T Unwrap(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// A numpy-compatible buffer of [layers, 2, tokens, kv_heads, head_dim] as a
// KVView over the same memory (no copy; any non-negative strides). float32
// and float16 buffers carry their dtype; bfloat16 arrives as 16-bit integers
// (numpy has no bfloat16) with dtype "bf16" given. `dtype` empty: from the
// buffer. The buffer_info keeps the memory pinned while the view is used.
struct KVBuffer {
  py::buffer_info info;
  KVView view;
};
KVBuffer ViewOfBuffer(const py::buffer& buffer, const std::string& dtype, bool writable);

// A new C-contiguous numpy array for a KV tensor of `shape` and `dtype`
// (bf16: uint16 storage).
py::array NewKVArray(const KVShape& shape, DType dtype);

// bytes -> span without a copy (the caller keeps the object alive).
std::span<const uint8_t> BytesSpan(const py::bytes& bytes);
py::bytes ToBytes(std::span<const uint8_t> data);

void BindCodec(py::module_& m);
void BindProfiles(py::module_& m);
void BindStore(py::module_& m);
void BindStream(py::module_& m);

}  // namespace cachegen::python
