// Frame serialization and validation. Byte layout: docs/FORMAT.md, "Frames and containers".
#include "format/frame.h"

#include <cassert>
#include <cstring>
#include <string>

#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen {
namespace {

// Fixed header fields before params: magic u32, version u16, flags u16,
// codec u8, dtype u8, level u8, reserved u8, 7 x u32.
constexpr size_t kFixedBytes = 4 + 2 + 2 + 4 + 7 * 4;
constexpr size_t kSectionEntryBytes = 8 + 4 + 4 + 8;
constexpr uint32_t kMaxParamsBytes = 1u << 16;
constexpr uint32_t kMaxLevels = 8;
constexpr uint32_t kMaxLayers = 4096;  // KVShape::Validate's limit

const char* KVName(KV kv) { return kv == KV::kKey ? "K" : "V"; }

// The header of a frame (everything before its first section payload), for
// sections of the given sizes, side bytes and checksums in table order.
std::vector<uint8_t> WriteHeader(const FrameHeader& header, std::span<const SectionEntry> sections,
                                 uint64_t payload_bytes) {
  assert(sections.size() == 2 * uint64_t{header.shape.layers});
  assert(header.params.size() <= kMaxParamsBytes);
  const uint64_t key_bytes = header.chunk_key ? sizeof(ChunkKey::bytes) : 0;
  const uint64_t header_bytes = kFixedBytes + key_bytes + header.params.size() + sections.size() * kSectionEntryBytes + 8;
  std::vector<uint8_t> out;
  out.reserve(header_bytes + payload_bytes);
  // The magic is stored by resize + memcpy: GCC 12 misreports (-Wstringop-overflow)
  // a range insert into a still-empty vector.
  out.resize(4);
  const uint32_t magic = kFrameMagic;
  std::memcpy(out.data(), &magic, 4);
  ByteWriter w(&out);
  w.U16(header.chunk_key ? kFormatVersion : kUnboundFormatVersion);
  w.U16(0);  // flags
  w.U8(static_cast<uint8_t>(header.codec));
  w.U8(static_cast<uint8_t>(header.dtype));
  w.U8(static_cast<uint8_t>(header.level));
  w.U8(0);  // reserved
  w.U32(header.shape.layers);
  w.U32(header.shape.kv_heads);
  w.U32(header.shape.head_dim);
  w.U32(header.shape.tokens);
  w.U32(header.token_start);
  w.U32(header.context_tokens);
  w.U32(static_cast<uint32_t>(header.params.size()));
  if (header.chunk_key) w.Bytes(header.chunk_key->bytes);
  w.Bytes(header.params);
  uint64_t offset = header_bytes;
  for (const SectionEntry& s : sections) {
    w.U64(offset);
    w.U32(s.size);
    w.U32(s.side_bytes);
    w.U64(s.checksum);
    offset += s.size;
  }
  w.U64(Checksum64(out));
  assert(out.size() == header_bytes);
  return out;
}

}  // namespace

std::vector<uint8_t> WriteFrame(const FrameHeader& header, std::span<const EncodedSection> sections) {
  std::vector<SectionEntry> entries(sections.size());
  uint64_t payload_bytes = 0;
  for (size_t i = 0; i < sections.size(); ++i) {
    const EncodedSection& s = sections[i];
    assert(s.bytes.size() <= UINT32_MAX && s.side_bytes <= s.bytes.size());
    entries[i] = {0, static_cast<uint32_t>(s.bytes.size()), s.side_bytes, Checksum64(s.bytes)};
    payload_bytes += s.bytes.size();
  }
  std::vector<uint8_t> out = WriteHeader(header, entries, payload_bytes);
  for (const EncodedSection& s : sections) out.insert(out.end(), s.bytes.begin(), s.bytes.end());
  return out;
}

Result<std::vector<uint8_t>> BindFrame(std::span<const uint8_t> frame, const ChunkKey& key) {
  CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
  p.header.chunk_key = key;
  const std::span<const uint8_t> payloads = frame.subspan(p.header_bytes);
  std::vector<uint8_t> out = WriteHeader(p.header, p.sections, payloads.size());
  out.insert(out.end(), payloads.begin(), payloads.end());
  return out;
}

Result<ParsedFrame> ParseFrame(std::span<const uint8_t> frame) {
  ByteReader r(frame);
  const uint32_t magic = r.U32();
  if (!r.ok() || magic != kFrameMagic) return Status::Corrupt("not a cachegen frame (bad magic)");
  const uint16_t version = r.U16();
  if (!r.ok()) return Status::Corrupt("truncated frame header");
  if (version == 0) return Status::Corrupt("frame format version 0 is invalid");
  if (version > kFormatVersion)
    return Status::Unsupported("frame format version " + std::to_string(version) +
                               " is newer than the supported version " + std::to_string(kFormatVersion));
  const uint16_t flags = r.U16();
  ParsedFrame p;
  FrameHeader& h = p.header;
  const uint8_t codec = r.U8();
  const uint8_t dtype = r.U8();
  h.level = r.U8();
  const uint8_t reserved = r.U8();
  h.shape.layers = r.U32();
  h.shape.kv_heads = r.U32();
  h.shape.head_dim = r.U32();
  h.shape.tokens = r.U32();
  h.token_start = r.U32();
  h.context_tokens = r.U32();
  const uint32_t params_len = r.U32();
  if (version >= 2) {
    ChunkKey key;
    const auto bytes = r.Bytes(key.bytes.size());
    if (r.ok()) std::memcpy(key.bytes.data(), bytes.data(), key.bytes.size());
    h.chunk_key = key;
  }
  if (!r.ok()) return Status::Corrupt("truncated frame header");
  // Bound every size before it drives a read or an allocation.
  if (params_len > kMaxParamsBytes)
    return Status::Corrupt("frame params length " + std::to_string(params_len) + " exceeds limit");
  if (h.shape.layers == 0 || h.shape.layers > kMaxLayers)
    return Status::Corrupt("frame layer count " + std::to_string(h.shape.layers) + " out of range");
  const uint64_t table_bytes = 2 * uint64_t{h.shape.layers} * kSectionEntryBytes;
  if (r.remaining() < uint64_t{params_len} + table_bytes + 8) return Status::Corrupt("truncated frame header");
  auto params = r.Bytes(params_len);
  const size_t table_pos = r.position();
  r.Bytes(table_bytes);
  const uint64_t covered = r.position();
  const uint64_t stored = r.U64();
  if (!r.ok()) return Status::Corrupt("truncated frame header");
  if (Checksum64(frame.first(covered)) != stored) return Status::Corrupt("frame header checksum mismatch");

  // The header is intact as written; now check it is meaningful.
  if (flags != 0) return Status::Corrupt("frame flags " + std::to_string(flags) + " not supported");
  if (reserved != 0) return Status::Corrupt("frame reserved byte is not zero");
  if (dtype > static_cast<uint8_t>(DType::kBF16))
    return Status::Corrupt("frame source dtype " + std::to_string(dtype) + " invalid");
  if (h.level >= kMaxLevels) return Status::Corrupt("frame level " + std::to_string(h.level) + " out of range");
  if (Status s = h.shape.Validate(); !s.ok()) return Status::Corrupt("frame shape invalid: " + s.message());
  if (uint64_t{h.token_start} + h.shape.tokens > UINT32_MAX)
    return Status::Corrupt("frame token range overflows");
  h.codec = static_cast<CodecId>(codec);
  h.dtype = static_cast<DType>(dtype);
  h.params.assign(params.begin(), params.end());
  p.header_bytes = covered + 8;

  ByteReader t(frame.subspan(table_pos, table_bytes));
  p.sections.resize(2 * size_t{h.shape.layers});
  uint64_t expect = p.header_bytes;
  for (size_t i = 0; i < p.sections.size(); ++i) {
    SectionEntry& e = p.sections[i];
    e.offset = t.U64();
    e.size = t.U32();
    e.side_bytes = t.U32();
    e.checksum = t.U64();
    const std::string where = "layer " + std::to_string(i / 2) + " " + KVName(static_cast<KV>(i % 2));
    if (e.offset != expect) return Status::Corrupt("frame " + where + " section offset out of order");
    if (e.side_bytes > e.size) return Status::Corrupt("frame " + where + " side bytes exceed section size");
    if (e.size > frame.size() - expect) return Status::Corrupt("frame " + where + " section past frame end");
    expect += e.size;
  }
  if (!t.ok()) return Status::Internal("frame section table read failed");
  if (expect != frame.size())
    return Status::Corrupt("frame has " + std::to_string(frame.size() - expect) + " trailing bytes");
  return p;
}

Result<std::span<const uint8_t>> SectionPayload(const ParsedFrame& parsed, std::span<const uint8_t> frame,
                                                uint32_t layer, KV kv) {
  if (layer >= parsed.header.shape.layers)
    return Status::InvalidArgument("layer " + std::to_string(layer) + " out of range");
  const size_t i = 2 * size_t{layer} + static_cast<uint8_t>(kv);
  if (i >= parsed.sections.size()) return Status::InvalidArgument("section table incomplete");
  const SectionEntry& e = parsed.sections[i];
  if (e.offset > frame.size() || e.size > frame.size() - e.offset)
    return Status::Corrupt("section outside frame");
  auto payload = frame.subspan(e.offset, e.size);
  if (Checksum64(payload) != e.checksum)
    return Status::Corrupt("layer " + std::to_string(layer) + " " + KVName(kv) + " section checksum mismatch");
  return payload;
}

}  // namespace cachegen
