// Helpers shared by the baseline codecs (fp16-zstd, q8, q4, kivi, cachegen-ref).
// Baselines code every (layer, K|V) section independently at one fixed rate,
// so their Encode is "one level, one section per (layer, kv)".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "common/half.h"

namespace cachegen::baseline {

// Calls fn(layer, kv, values, section) for every section in frame order and
// returns the single level. fn returns a Status; the first error aborts.
template <typename Fn>
Result<std::vector<EncodedLevel>> EncodeEachSection(const ChunkF32& chunk, Fn&& fn) {
  EncodedLevel level;
  level.sections.reserve(size_t{chunk.shape.layers} * 2);
  for (uint32_t l = 0; l < chunk.shape.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue}) {
      EncodedSection s;
      Status st = fn(l, kv, chunk.Section(l, kv), s);
      if (!st.ok()) return st;
      level.sections.push_back(std::move(s));
    }
  std::vector<EncodedLevel> out;
  out.push_back(std::move(level));
  return out;
}

inline void PutF16(std::vector<uint8_t>& out, uint16_t h) {
  out.push_back(static_cast<uint8_t>(h));
  out.push_back(static_cast<uint8_t>(h >> 8));
}
inline uint16_t GetF16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// The smallest f16 value >= v (v finite, >= 0, <= 65504). Scales are rounded
// up so that |x| / scale never exceeds the code range: the quantizer's error
// bound (step / 2) then holds against the *stored* step.
inline uint16_t F16CeilNonNeg(float v) {
  uint16_t h = F32ToF16(v);
  if (F16ToF32(h) < v && h < 0x7bffu) ++h;
  return h;
}
// The largest f16 value <= v (v finite, |v| <= 65504).
inline uint16_t F16Floor(float v) {
  uint16_t h = F32ToF16(v);
  if (F16ToF32(h) > v) {
    if (h == 0x0000u) return 0x8001u;  // +0 > v < 0: smallest negative subnormal
    if (h == 0x8000u) return 0x8001u;
    h = (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
  }
  return h;
}

inline Status CheckFiniteSection(std::span<const float> in, const char* codec) {
  for (float x : in)
    if (!std::isfinite(x) || std::fabs(x) > 65504.0f)
      return Status::InvalidArgument(std::string(codec) + ": input value is not a finite f16-range number");
  return Status::Ok();
}

inline Status SizeMismatch(const char* codec, size_t got, uint64_t want) {
  return Status::Corrupt(std::string(codec) + " section has " + std::to_string(got) + " bytes, expected " +
                         std::to_string(want));
}

// Dense LSB-first bit packing of fixed-width codes.
class BitPacker {
 public:
  explicit BitPacker(std::vector<uint8_t>* out) : out_(out) {}
  void Put(uint32_t v, uint32_t bits) {
    acc_ |= uint64_t{v} << n_;
    n_ += bits;
    while (n_ >= 8) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  void Flush() {
    if (n_ > 0) out_->push_back(static_cast<uint8_t>(acc_));
    acc_ = 0;
    n_ = 0;
  }

 private:
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  uint32_t n_ = 0;
};

// Reads codes packed by BitPacker. The caller has validated that `in` holds
// every bit it will ask for; reads past the end return zeros (never UB).
class BitUnpacker {
 public:
  explicit BitUnpacker(std::span<const uint8_t> in) : in_(in) {}
  uint32_t Get(uint32_t bits) {
    while (n_ < bits) {
      const uint64_t b = pos_ < in_.size() ? in_[pos_] : 0;
      ++pos_;
      acc_ |= b << n_;
      n_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    n_ -= bits;
    return v;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  uint32_t n_ = 0;
};

}  // namespace cachegen::baseline
