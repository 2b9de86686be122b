// libFuzzer target: KV file parsers (npy, safetensors, kvraw) on arbitrary
// bytes. The first byte picks the format. Parsing must return ok or a Status,
// never crash, and never allocate more than the input size implies.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto format = static_cast<cachegen::KVFileFormat>(data[0] % 3);
  std::span<const uint8_t> bytes(data + 1, size - 1);
  auto r = cachegen::ParseKV(bytes, format);
  if (r.ok()) {
    // A parsed tensor must serialize and parse back to the same shape.
    auto again = cachegen::SerializeKV(*r, format);
    if (!again.ok()) __builtin_trap();
    auto back = cachegen::ParseKV(*again, format);
    if (!back.ok() || !(back->shape() == r->shape())) __builtin_trap();
  }
  return 0;
}
