// Container serialization and validation. Byte layout: docs/FORMAT.md, "Frames and containers".
#include "format/container.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

#include "common/bytes.h"
#include "common/checksum.h"
#include "format/frame.h"

namespace cachegen {
namespace {

// magic u32, version u16, flags u16, codec u8, dtype u8, levels u8,
// reserved u8, layers/kv_heads/head_dim/tokens/token_start/chunk_tokens/chunks u32.
constexpr size_t kFixedBytes = 4 + 2 + 2 + 4 + 7 * 4;
constexpr uint32_t kMaxLevels = 8;

uint64_t EntryBytes(uint32_t levels) { return 8 + 16 * uint64_t{levels}; }

}  // namespace

std::vector<uint8_t> WriteContainer(const ContainerInfo& info,
                                    const std::vector<std::vector<std::vector<uint8_t>>>& frames) {
  assert(info.levels >= 1 && info.levels <= kMaxLevels);
  assert(info.chunk_tokens >= 1);
  auto codec = CodecByName(info.codec);
  assert(codec.ok());
  uint64_t total = kFixedBytes + frames.size() * EntryBytes(info.levels) + 8;
  for (const auto& chunk : frames)
    for (const auto& f : chunk) total += f.size();
  std::vector<uint8_t> out;
  out.reserve(total);
  // The magic is stored by resize + memcpy: GCC 12 misreports (-Wstringop-overflow)
  // a range insert into a still-empty vector.
  out.resize(4);
  const uint32_t magic = kContainerMagic;
  std::memcpy(out.data(), &magic, 4);
  ByteWriter w(&out);
  w.U16(kContainerFormatVersion);
  w.U16(0);
  w.U8(codec.ok() ? static_cast<uint8_t>((*codec)->id()) : 0);
  w.U8(static_cast<uint8_t>(info.dtype));
  w.U8(static_cast<uint8_t>(info.levels));
  w.U8(0);
  w.U32(info.shape.layers);
  w.U32(info.shape.kv_heads);
  w.U32(info.shape.head_dim);
  w.U32(info.shape.tokens);
  w.U32(info.token_start);
  w.U32(info.chunk_tokens);
  w.U32(static_cast<uint32_t>(frames.size()));
  uint64_t offset = kFixedBytes + frames.size() * EntryBytes(info.levels) + 8;
  for (size_t c = 0; c < frames.size(); ++c) {
    assert(frames[c].size() == info.levels);
    const uint32_t begin = static_cast<uint32_t>(c * info.chunk_tokens);
    const uint32_t tokens = std::min(info.chunk_tokens, info.shape.tokens - begin);
    w.U32(info.token_start + begin);
    w.U32(tokens);
    for (const auto& f : frames[c]) {
      w.U64(offset);
      w.U64(f.size());
      offset += f.size();
    }
  }
  w.U64(Checksum64(out));
  for (const auto& chunk : frames)
    for (const auto& f : chunk) w.Bytes(f);
  return out;
}

Result<ContainerInfo> ParseContainer(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  const uint32_t magic = r.U32();
  if (!r.ok() || magic != kContainerMagic) return Status::Corrupt("not a cachegen container (bad magic)");
  const uint16_t version = r.U16();
  if (!r.ok()) return Status::Corrupt("truncated container header");
  if (version == 0) return Status::Corrupt("container format version 0 is invalid");
  if (version > kContainerFormatVersion)
    return Status::Unsupported("container format version " + std::to_string(version) +
                               " is newer than the supported version " + std::to_string(kContainerFormatVersion));
  ContainerInfo info;
  info.format_version = version;
  const uint16_t flags = r.U16();
  const uint8_t codec = r.U8();
  const uint8_t dtype = r.U8();
  info.levels = r.U8();
  const uint8_t reserved = r.U8();
  info.shape.layers = r.U32();
  info.shape.kv_heads = r.U32();
  info.shape.head_dim = r.U32();
  info.shape.tokens = r.U32();
  info.token_start = r.U32();
  info.chunk_tokens = r.U32();
  const uint32_t chunks = r.U32();
  if (!r.ok()) return Status::Corrupt("truncated container header");
  if (info.levels < 1 || info.levels > kMaxLevels)
    return Status::Corrupt("container level count " + std::to_string(info.levels) + " out of range 1..8");
  // Cap the index by the bytes present before allocating anything for it.
  const uint64_t index_bytes = uint64_t{chunks} * EntryBytes(info.levels);
  if (chunks == 0) return Status::Corrupt("container has no chunks");
  if (index_bytes + 8 > r.remaining()) return Status::Corrupt("truncated container index");
  r.Bytes(index_bytes);
  const size_t covered = r.position();
  const uint64_t stored = r.U64();
  if (!r.ok()) return Status::Corrupt("truncated container index");
  if (Checksum64(bytes.first(covered)) != stored) return Status::Corrupt("container header checksum mismatch");

  if (flags != 0) return Status::Corrupt("container flags " + std::to_string(flags) + " not supported");
  if (reserved != 0) return Status::Corrupt("container reserved byte is not zero");
  if (dtype > static_cast<uint8_t>(DType::kBF16))
    return Status::Corrupt("container source dtype " + std::to_string(dtype) + " invalid");
  info.dtype = static_cast<DType>(dtype);
  auto c = CodecById(codec);
  if (!c.ok()) return c.status();
  info.codec = std::string((*c)->name());
  if (Status s = info.shape.Validate(); !s.ok()) return Status::Corrupt("container shape invalid: " + s.message());
  if (uint64_t{info.token_start} + info.shape.tokens > UINT32_MAX)
    return Status::Corrupt("container token range overflows");
  if (info.chunk_tokens == 0) return Status::Corrupt("container chunk_tokens is zero");
  const uint64_t expect_chunks = (uint64_t{info.shape.tokens} + info.chunk_tokens - 1) / info.chunk_tokens;
  if (chunks != expect_chunks)
    return Status::Corrupt("container has " + std::to_string(chunks) + " chunks, expected " +
                           std::to_string(expect_chunks));

  ByteReader ix(bytes.subspan(kFixedBytes, index_bytes));
  info.chunks.resize(chunks);
  uint64_t next_token = info.token_start;
  uint64_t next_offset = covered + 8;
  for (uint32_t i = 0; i < chunks; ++i) {
    ChunkEntry& e = info.chunks[i];
    e.token_start = ix.U32();
    e.tokens = ix.U32();
    const uint64_t want_tokens =
        std::min<uint64_t>(info.chunk_tokens, uint64_t{info.token_start} + info.shape.tokens - next_token);
    if (e.token_start != next_token || e.tokens != want_tokens)
      return Status::Corrupt("container chunk " + std::to_string(i) + " does not tile the token range");
    next_token += e.tokens;
    e.frame_offset.resize(info.levels);
    e.frame_size.resize(info.levels);
    for (uint32_t l = 0; l < info.levels; ++l) {
      e.frame_offset[l] = ix.U64();
      e.frame_size[l] = ix.U64();
      // Frames are stored back to back in (chunk, level) order.
      if (e.frame_offset[l] != next_offset || e.frame_size[l] == 0 ||
          e.frame_size[l] > bytes.size() - next_offset)
        return Status::Corrupt("container chunk " + std::to_string(i) + " level " + std::to_string(l) +
                               " frame out of bounds");
      next_offset += e.frame_size[l];
    }
  }
  if (!ix.ok()) return Status::Internal("container index read failed");
  if (next_offset != bytes.size())
    return Status::Corrupt("container has " + std::to_string(bytes.size() - next_offset) + " trailing bytes");
  info.bytes = bytes.size();
  return info;
}

Status CheckFrameAgainstIndex(const ContainerInfo& info, uint32_t chunk, uint32_t level, const FrameHeader& h) {
  const ChunkEntry& e = info.chunks.at(chunk);
  const std::string where = "chunk " + std::to_string(chunk) + " level " + std::to_string(level);
  auto codec = CodecById(static_cast<uint8_t>(h.codec));
  if (!codec.ok() || (*codec)->name() != info.codec)
    return Status::Corrupt(where + " frame codec differs from the container's");
  if (h.dtype != info.dtype) return Status::Corrupt(where + " frame dtype differs from the container's");
  if (h.level != level) return Status::Corrupt(where + " frame has level " + std::to_string(h.level));
  if (h.shape.layers != info.shape.layers || h.shape.kv_heads != info.shape.kv_heads ||
      h.shape.head_dim != info.shape.head_dim || h.shape.tokens != e.tokens)
    return Status::Corrupt(where + " frame shape " + h.shape.ToString() + " differs from the index");
  if (h.token_start != e.token_start) return Status::Corrupt(where + " frame token_start differs from the index");
  return Status::Ok();
}

}  // namespace cachegen
