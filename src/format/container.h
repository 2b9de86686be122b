// Containers (.cgkv): a context's frames with a chunk index (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/status.h"

namespace cachegen {

constexpr uint32_t kContainerMagic = 0x564b4743;  // "CGKV" little-endian

// frames[chunk][level]: serialized frames. info supplies codec, dtype, shape,
// token_start, levels and chunk_tokens; its chunks/offsets are computed here.
std::vector<uint8_t> WriteContainer(const ContainerInfo& info,
                                    const std::vector<std::vector<std::vector<uint8_t>>>& frames);

// Validates header, index and checksum: chunks tile the context's tokens in
// order, every frame lies inside the container. Frames themselves are
// validated when decoded.
Result<ContainerInfo> ParseContainer(std::span<const uint8_t> bytes);

}  // namespace cachegen
