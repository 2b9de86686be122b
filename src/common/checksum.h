// Section checksums: XXH3-64 (libxxhash), seed 0.
#pragma once

#include <cstdint>
#include <span>

namespace cachegen {

uint64_t Checksum64(std::span<const uint8_t> bytes);

}  // namespace cachegen
