#include "store/record.h"

#include <cstring>

#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen::store {

std::vector<uint8_t> EncodeRecord(const ChunkKey& key, uint32_t level, std::span<const uint8_t> frame) {
  std::vector<uint8_t> out(kRecordHeaderSize + frame.size());
  uint8_t* p = out.data();
  const auto put = [&p](const void* v, size_t n) {
    std::memcpy(p, v, n);
    p += n;
  };
  const uint32_t magic = kRecordMagic, reserved = 0;
  const uint16_t version = kRecordVersion, flags = 0;
  const uint64_t length = frame.size(), checksum = Checksum64(frame);
  put(&magic, 4);
  put(&version, 2);
  put(&flags, 2);
  put(key.bytes.data(), key.bytes.size());
  put(&level, 4);
  put(&reserved, 4);
  put(&length, 8);
  put(&checksum, 8);
  if (!frame.empty()) std::memcpy(p, frame.data(), frame.size());
  return out;
}

Result<RecordHeader> VerifyRecord(std::span<const uint8_t> record, std::span<const uint8_t>* payload) {
  if (record.size() < kRecordHeaderSize)
    return Status::Corrupt("store record truncated: " + std::to_string(record.size()) + " bytes, header needs " +
                           std::to_string(kRecordHeaderSize));
  ByteReader r(record);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint16_t flags = r.U16();
  RecordHeader h;
  const auto key = r.Bytes(h.key.bytes.size());
  std::memcpy(h.key.bytes.data(), key.data(), key.size());
  h.level = r.U32();
  const uint32_t reserved = r.U32();
  h.length = r.U64();
  h.checksum = r.U64();
  if (!r.ok()) return Status::Internal("store record header read failed");
  if (magic != kRecordMagic) return Status::Corrupt("store record: bad magic");
  if (version != kRecordVersion)
    return Status::Corrupt("store record: unsupported version " + std::to_string(version));
  if (flags != 0 || reserved != 0) return Status::Corrupt("store record: non-zero flags or reserved field");
  if (h.length != r.remaining())
    return Status::Corrupt("store record: length field says " + std::to_string(h.length) + " bytes, " +
                           std::to_string(r.remaining()) + " present (torn or truncated)");
  const auto body = r.Rest();
  if (Checksum64(body) != h.checksum) return Status::Corrupt("store record: payload checksum mismatch");
  if (payload) *payload = body;
  return h;
}

Result<std::span<const uint8_t>> OpenRecord(std::span<const uint8_t> record, const ChunkKey& key, uint32_t level) {
  std::span<const uint8_t> payload;
  CG_ASSIGN_OR_RETURN(const RecordHeader h, VerifyRecord(record, &payload));
  if (h.key != key || h.level != level)
    return Status::Corrupt("store record: misplaced (holds " + h.key.Hex() + "/" + std::to_string(h.level) +
                           ", expected " + key.Hex() + "/" + std::to_string(level) + ")");
  return payload;
}

}  // namespace cachegen::store
