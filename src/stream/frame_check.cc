// FrameIsChunk (include/cachegen/stream.h): what a reader checks before it
// takes a fetched frame as the chunk it asked for.
#include "cachegen/stream.h"

namespace cachegen {

Result<FrameInfo> FrameIsStoredAs(std::span<const uint8_t> frame, const ChunkKey& key, uint32_t level) {
  CG_ASSIGN_OR_RETURN(FrameInfo info, VerifyFrame(frame));
  if (!info.chunk_key) return Status::Corrupt("frame is not bound to a chunk key (format version 1)");
  if (*info.chunk_key != key) return Status::Corrupt("misplaced frame: it is chunk " + info.chunk_key->Hex());
  if (info.level != level)
    return Status::Corrupt("frame is level " + std::to_string(info.level) + ", stored as " + std::to_string(level));
  return info;
}

Result<FrameInfo> FrameIsChunk(std::span<const uint8_t> frame, const ChunkKey& key, uint32_t level,
                               uint32_t token_start, uint32_t tokens) {
  CG_ASSIGN_OR_RETURN(FrameInfo info, FrameIsStoredAs(frame, key, level));
  if (info.token_start != token_start || info.shape.tokens != tokens)
    return Status::Corrupt("frame holds tokens [" + std::to_string(info.token_start) + ", " +
                           std::to_string(uint64_t{info.token_start} + info.shape.tokens) + "), the chunk is [" +
                           std::to_string(token_start) + ", " + std::to_string(uint64_t{token_start} + tokens) + ")");
  return info;
}

}  // namespace cachegen
