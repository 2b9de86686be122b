// Containers (.cgkv): a context's frames with a chunk index (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/status.h"
#include "format/frame.h"

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

// Checks that a frame's header agrees with its container's header and index
// entry (FORMAT.md "Container", check 8): codec, dtype, level, shape,
// tokens and token_start.
Status CheckFrameAgainstIndex(const ContainerInfo& info, uint32_t chunk, uint32_t level, const FrameHeader& h);

}  // namespace cachegen
