// Little-endian byte serialization. ByteReader is the only way decoders read
// untrusted bytes: every read is bounds-checked and reports failure instead of
// reading past the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace cachegen {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  // Unsigned LEB128.
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void Bytes(std::span<const uint8_t> b) { out_->insert(out_->end(), b.begin(), b.end()); }
  size_t size() const { return out_->size(); }
  std::vector<uint8_t>& buffer() { return *out_; }

 private:
  // The format is little-endian; so are all supported hosts (static_assert in bytes.cc).
  // resize + memcpy rather than insert: GCC 12 reports a false
  // -Wstringop-overflow for insert into a vector that may still be empty.
  void Raw(const void* p, size_t n) {
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, p, n);
  }
  std::vector<uint8_t>* out_;
};

// Reads from a span; after the first failed read ok() is false and all further
// reads return zeros, so callers may check once after a group of reads.
class ByteReader {
 public:
  ByteReader() = default;
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  bool ok() const { return ok_; }
  size_t remaining() const { return ok_ ? in_.size() - pos_ : 0; }
  size_t position() const { return pos_; }

  uint8_t U8() { uint8_t v = 0; Raw(&v, 1); return v; }
  uint16_t U16() { uint16_t v = 0; Raw(&v, 2); return v; }
  uint32_t U32() { uint32_t v = 0; Raw(&v, 4); return v; }
  uint64_t U64() { uint64_t v = 0; Raw(&v, 8); return v; }
  float F32() { float v = 0; Raw(&v, 4); return v; }
  // Unsigned LEB128 of at most 10 bytes; longer or overflowing encodings fail.
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = U8();
      if (!ok_) return 0;
      if (shift == 63 && b > 1) break;
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok_ = false;
    return 0;
  }
  // The next n bytes as a span (empty and !ok() when fewer remain).
  std::span<const uint8_t> Bytes(size_t n) {
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return {};
    }
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::span<const uint8_t> Rest() { return Bytes(remaining()); }

 private:
  void Raw(void* p, size_t n) {
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return;
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace cachegen
