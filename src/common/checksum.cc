#include "common/checksum.h"

#include <xxhash.h>

namespace cachegen {

uint64_t Checksum64(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace cachegen
