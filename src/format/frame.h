// Frames: one chunk at one quality level, self-contained (docs/FORMAT.md).
// A frame is what a chunk store keeps under one key; its sections (one per
// layer and K|V) each carry an XXH3-64 checksum, so one layer can be verified
// and decoded without touching the others.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"
#include "cachegen/chunk_key.h"
#include "codec/codec.h"

namespace cachegen {

constexpr uint32_t kFrameMagic = 0x464b4743;  // "CGKF" little-endian
// Version 2 adds the chunk key a frame is bound to (BindFrame); frames not
// bound to a key are still written as version 1, byte for byte as before.
constexpr uint16_t kFormatVersion = 2;
constexpr uint16_t kUnboundFormatVersion = 1;
// Containers (.cgkv) are format version 1; their frames are unbound.
constexpr uint16_t kContainerFormatVersion = 1;

struct FrameHeader {
  CodecId codec = CodecId::kFp16;
  DType dtype = DType::kF16;  // source dtype
  uint32_t level = 0;
  KVShape shape;
  uint32_t token_start = 0;
  uint32_t context_tokens = 0;
  std::vector<uint8_t> params;
  // The chunk this frame was stored as (format version 2); unset: version 1,
  // a frame of a container or not yet stored.
  std::optional<ChunkKey> chunk_key;
};

struct SectionEntry {
  uint64_t offset = 0;  // from the frame start
  uint32_t size = 0;
  uint32_t side_bytes = 0;
  uint64_t checksum = 0;
};

struct ParsedFrame {
  FrameHeader header;
  std::vector<SectionEntry> sections;  // 2 * layers, (layer, K|V) order
  uint64_t header_bytes = 0;           // everything before the first section
};

// Serializes a frame. sections.size() must be 2 * header.shape.layers.
std::vector<uint8_t> WriteFrame(const FrameHeader& header, std::span<const EncodedSection> sections);

// The same frame bound to `key`: its header rewritten as version 2 with the
// key (replacing any key it had), its section payloads unchanged.
Result<std::vector<uint8_t>> BindFrame(std::span<const uint8_t> frame, const ChunkKey& key);

// Validates magic, version, header checksum, shape limits and that every
// section lies inside the frame, in order, without overlap, and that the frame
// ends where the last section ends. Does not verify section checksums.
Result<ParsedFrame> ParseFrame(std::span<const uint8_t> frame);

// The payload of one section, after verifying its checksum.
Result<std::span<const uint8_t>> SectionPayload(const ParsedFrame& parsed, std::span<const uint8_t> frame,
                                                uint32_t layer, KV kv);

}  // namespace cachegen
