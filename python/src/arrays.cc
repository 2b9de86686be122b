// KV tensors between numpy buffers and cachegen views, without copies.
#include <limits>
#include <optional>

#include "bindings.h"

namespace cachegen::python {
namespace {

// The element type a buffer's format names, or nullopt (numpy writes native
// byte order as "f"/"e"/"H", sometimes prefixed by '=', '<' or '@').
std::optional<DType> DTypeOfFormat(std::string format, size_t itemsize, const std::string& requested) {
  if (!format.empty() && (format[0] == '=' || format[0] == '<' || format[0] == '@')) format.erase(0, 1);
  if (format == "f" && itemsize == 4) return DType::kF32;
  if (format == "e" && itemsize == 2) return DType::kF16;
  // bfloat16 storage: numpy has no such type; 16-bit integers stand in.
  if ((format == "H" || format == "h") && itemsize == 2 && requested == "bf16") return DType::kBF16;
  return std::nullopt;
}

uint32_t Dim(py::ssize_t n, const char* name) {
  if (n <= 0 || static_cast<uint64_t>(n) > std::numeric_limits<uint32_t>::max())
    throw py::value_error(std::string("KV array: ") + name + " must be in [1, 2^32), got " + std::to_string(n));
  return static_cast<uint32_t>(n);
}

}  // namespace

KVBuffer ViewOfBuffer(const py::buffer& buffer, const std::string& dtype, bool writable) {
  KVBuffer out{buffer.request(writable), {}};
  const py::buffer_info& info = out.info;
  if (info.ndim != 5 || info.shape[1] != 2)
    throw py::value_error("KV array must be [layers, 2, tokens, kv_heads, head_dim] (K then V), got " +
                          std::to_string(info.ndim) + " dimensions");
  // A misspelt name is an error, not "from the buffer".
  const std::optional<DType> requested = dtype.empty() ? std::nullopt : std::optional(Unwrap(ParseDType(dtype)));
  const std::optional<DType> dt = DTypeOfFormat(info.format, static_cast<size_t>(info.itemsize), dtype);
  if (!dt)
    throw py::value_error("KV array: element type '" + info.format +
                          "' is not float32 or float16 (bfloat16: a uint16/int16 array with dtype='bf16')");
  if (requested && *requested != *dt)
    throw py::value_error("KV array holds " + std::string(DTypeName(*dt)) + ", not " + dtype);
  int64_t strides[5];
  for (int i = 0; i < 5; ++i) {
    if (info.strides[i] < 0 || info.strides[i] % info.itemsize != 0)
      throw py::value_error("KV array: strides must be non-negative multiples of the element size");
    strides[i] = info.strides[i] / info.itemsize;
  }
  const KVShape shape{.layers = Dim(info.shape[0], "layers"), .kv_heads = Dim(info.shape[3], "kv_heads"),
                      .head_dim = Dim(info.shape[4], "head_dim"), .tokens = Dim(info.shape[2], "tokens")};
  Check(shape.Validate());
  out.view = KVView(info.ptr, *dt, shape,
                    KVStrides{.layer = strides[0], .kv = strides[1], .token = strides[2], .head = strides[3],
                              .dim = strides[4]});
  return out;
}

py::array NewKVArray(const KVShape& shape, DType dtype) {
  const std::vector<py::ssize_t> dims{shape.layers, 2, shape.tokens, shape.kv_heads, shape.head_dim};
  switch (dtype) {
    case DType::kF32:
      return py::array(py::dtype("float32"), dims);
    case DType::kF16:
      return py::array(py::dtype("float16"), dims);
    case DType::kBF16:
      return py::array(py::dtype("uint16"), dims);
  }
  throw py::value_error("unknown dtype");
}

}  // namespace cachegen::python
