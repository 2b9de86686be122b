// Store record: how every backend wraps a frame before it stores it, so that
// what is read back can be verified (docs/FORMAT.md, "Store record").
//
//   u32 magic "CGSR" | u16 version 1 | u16 flags 0 | 16 B key | u32 level |
//   u32 reserved 0 | u64 payload length | u64 xxh3 of the payload | payload
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen::store {

inline constexpr uint32_t kRecordMagic = 0x52534743;  // "CGSR" little-endian
inline constexpr uint16_t kRecordVersion = 1;
inline constexpr size_t kRecordHeaderSize = 48;

struct RecordHeader {
  ChunkKey key;
  uint32_t level = 0;
  uint64_t length = 0;    // payload bytes
  uint64_t checksum = 0;  // xxh3 of the payload
};

std::vector<uint8_t> EncodeRecord(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame);

// Parses and checks a whole record: magic, version, flags/reserved zero,
// length equal to the bytes after the header, payload checksum. kCorrupt
// (with the reason) on any failure. On success `*payload` (if given) views
// the frame inside `record`.
Result<RecordHeader> VerifyRecord(std::span<const uint8_t> record, std::span<const uint8_t>* payload = nullptr);

// VerifyRecord, and the record must be the one stored for (key, level):
// a record found under another address is corrupt ("misplaced").
Result<std::span<const uint8_t>> OpenRecord(std::span<const uint8_t> record, const ChunkKey& key, uint32_t level);

}  // namespace cachegen::store
