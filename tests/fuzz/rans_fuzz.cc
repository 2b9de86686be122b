// libFuzzer target: DecodeStream on arbitrary bytes must never crash, and a
// successful decode must re-encode to a stream that decodes to the same
// symbols. The first input byte picks the symbol count.
#include <cstdint>
#include <vector>

#include "codec/rans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = static_cast<size_t>(data[0]) * 17 + data[1];
  cachegen::ByteReader r(std::span<const uint8_t>(data + 2, size - 2));
  std::vector<uint32_t> out(n);
  if (!cachegen::rans::DecodeStream(r, out).ok()) return 0;
  std::vector<uint8_t> buf;
  cachegen::ByteWriter w(&buf);
  cachegen::rans::EncodeStream(out, w);
  cachegen::ByteReader r2(buf);
  std::vector<uint32_t> again(n);
  if (!cachegen::rans::DecodeStream(r2, again).ok() || again != out) __builtin_trap();
  return 0;
}
