// libFuzzer target: Profile::Parse on arbitrary bytes must never crash. The
// input gets a valid trailing checksum so the fuzzer reaches the field checks
// behind it; a parsed profile must re-parse from its own bytes with the same id.
#include <cstdint>
#include <vector>

#include "cachegen/profile.h"
#include "common/bytes.h"
#include "common/checksum.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  cachegen::ByteWriter w(&bytes);
  w.U64(cachegen::Checksum64(std::span<const uint8_t>(data, size)));
  for (const auto& in : {std::vector<uint8_t>(data, data + size), bytes}) {
    auto p = cachegen::Profile::Parse(in);
    if (!p.ok()) continue;
    auto again = cachegen::Profile::Parse((*p)->bytes());
    if (!again.ok() || (*again)->id() != (*p)->id()) __builtin_trap();
  }
  return 0;
}
