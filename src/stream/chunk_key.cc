// Chunk key chain (include/cachegen/stream.h; byte layout in docs/SERVICE.md).
#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <cstring>

#include "cachegen/stream.h"
#include "common/bytes.h"

namespace cachegen {
namespace {

ChunkKey FromHash(const std::vector<uint8_t>& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, h);  // big-endian, platform independent
  ChunkKey key;
  std::memcpy(key.bytes.data(), canon.digest, 16);
  return key;
}

// str(s) = u64 length ‖ bytes.
void WriteStr(ByteWriter& w, std::string_view s) {
  w.U64(s.size());
  w.Bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

}  // namespace

ChunkKey ChainRoot(std::string_view model_fingerprint, std::string_view codec_profile, uint32_t chunk_tokens) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  WriteStr(w, "cachegen-chunk-root-v1");
  WriteStr(w, model_fingerprint);
  WriteStr(w, codec_profile);
  w.U32(chunk_tokens);
  return FromHash(buf);
}

ChunkKey ModelProfileKey(std::string_view model_fingerprint, std::string_view settings) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  WriteStr(w, "cachegen-model-profile-v1");
  WriteStr(w, model_fingerprint);
  WriteStr(w, settings);
  return FromHash(buf);
}

std::string WithModelProfile(std::string_view codec_profile, uint64_t id) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id));
  return std::string(codec_profile) + ";profile=" + hex;
}

ChunkKey NextChunkKey(const ChunkKey& previous, std::span<const TokenId> tokens) {
  std::vector<uint8_t> buf;
  buf.reserve(16 + 4 * tokens.size());
  ByteWriter w(&buf);
  w.Bytes(previous.bytes);
  for (TokenId t : tokens) w.U32(static_cast<uint32_t>(t));
  return FromHash(buf);
}

std::vector<ChunkKey> ChunkKeys(const ChunkKey& root, std::span<const TokenId> tokens, uint32_t chunk_tokens) {
  std::vector<ChunkKey> keys;
  if (chunk_tokens == 0) return keys;
  ChunkKey prev = root;
  for (size_t b = 0; b < tokens.size(); b += chunk_tokens) {
    prev = NextChunkKey(prev, tokens.subspan(b, std::min<size_t>(chunk_tokens, tokens.size() - b)));
    keys.push_back(prev);
  }
  return keys;
}

bool CachedChunk::any() const {
  for (uint64_t b : level_bytes)
    if (b > 0) return true;
  return false;
}

std::vector<CachedChunk> LookupPrefix(ChunkStore& store, std::span<const ChunkKey> keys, uint32_t levels,
                                      Status* error) {
  levels = std::min(levels, kMaxChunkLevels);
  if (error) *error = Status::Ok();
  Result<ChunkStore::PrefixSizes> sizes = store.SizesOfPrefix(keys, levels);
  if (!sizes.ok()) {
    if (error) *error = sizes.status();
    return {};
  }
  if (error) *error = sizes->store_error;
  std::vector<CachedChunk> out;
  for (size_t i = 0; i < sizes->level_bytes.size() && i < keys.size(); ++i)
    out.push_back(CachedChunk{keys[i], std::move(sizes->level_bytes[i])});
  return out;
}

Result<std::vector<TokenId>> ParseTokenIds(std::string_view text) {
  std::vector<TokenId> ids;
  size_t i = 0;
  auto sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < text.size()) {
    if (sep(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !sep(text[j])) ++j;
    const std::string_view tok = text.substr(i, j - i);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || p != tok.data() + tok.size() || v < INT32_MIN || v > INT32_MAX)
      return Status::InvalidArgument("bad token id '" + std::string(tok.substr(0, 32)) + "' (entry " +
                                     std::to_string(ids.size() + 1) + ")");
    ids.push_back(static_cast<TokenId>(v));
    i = j;
  }
  return ids;
}

}  // namespace cachegen
