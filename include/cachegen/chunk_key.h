// The address of one chunk of a context: what a frame is bound to
// (BindFrameToChunk) and what a chunk store files it under (store.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "cachegen/status.h"

namespace cachegen {

// 128-bit chunk address. Written as 32 lowercase hex digits wherever it
// crosses a process boundary (file names, Redis keys, URLs).
struct ChunkKey {
  std::array<uint8_t, 16> bytes{};

  std::string Hex() const;
  // Accepts exactly 32 hex digits (either case); anything else is kInvalidArgument.
  static Result<ChunkKey> FromHex(std::string_view hex);

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  friend auto operator<=>(const ChunkKey&, const ChunkKey&) = default;
};

}  // namespace cachegen
