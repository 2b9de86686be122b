#include <string>

#include "cachegen/chunk_key.h"

namespace cachegen {

std::string ChunkKey::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * bytes.size(), '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

Result<ChunkKey> ChunkKey::FromHex(std::string_view hex) {
  ChunkKey key;
  if (hex.size() != 2 * key.bytes.size())
    return Status::InvalidArgument("chunk key must be " + std::to_string(2 * key.bytes.size()) +
                                   " hex digits, got " + std::to_string(hex.size()) + " characters");
  for (size_t i = 0; i < key.bytes.size(); ++i) {
    const int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("chunk key has a non-hex character");
    key.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

}  // namespace cachegen
