// Parsing of rANS stream headers (FORMAT.md "Symbol streams"): the checks on
// untrusted input, the parsed forms of inline-table and table-cycle streams.
#include <cstdint>
#include <span>
#include <string>

#include "codec/rans.h"
#include "codec/rans_internal.h"

namespace cachegen::rans {

using internal::BuildTable;
using internal::Corrupt;
using internal::kL;
using internal::kMaxEscape;
using internal::kMinEscape;
using internal::Load16;

namespace internal {

Status Corrupt(const std::string& what) { return Status::Corrupt("rANS stream: " + what); }

}  // namespace internal

namespace {

// The part of a mode 2 or 3 stream after its table: lanes, lengths, escape
// area, payload; the initial lane states are checked.
Status ParseLanesAndAreas(ByteReader& in, size_t n, StreamHeader* s) {
  const uint32_t lanes = in.U8();
  const uint64_t esc_len = in.Varint();
  const uint64_t payload_len = in.Varint();
  if (!in.ok()) return Corrupt("truncated stream header");
  if (lanes < 1 || lanes > kMaxLanes) return Corrupt("lane count " + std::to_string(lanes) + " outside [1, 32]");
  if (payload_len % 2 != 0) return Corrupt("odd payload length");
  const uint64_t nwords = payload_len / 2;
  // Every symbol reads at most one word, plus two per lane for the states;
  // more could never be consumed.
  if (nwords < 2ull * lanes || nwords - 2ull * lanes > n) {
    return Corrupt("payload of " + std::to_string(payload_len) + " bytes is inconsistent with " + std::to_string(n) +
                   " symbols and " + std::to_string(lanes) + " lanes");
  }
  // Each escape varint is at most 5 bytes (values are 32-bit).
  if (esc_len > 5ull * n) return Corrupt("escape area longer than the symbols could need");
  s->lanes = lanes;
  s->esc = in.Bytes(esc_len);
  s->payload = in.Bytes(payload_len);
  if (!in.ok()) return Corrupt("truncated escape area or payload");
  for (uint32_t j = 0; j < lanes; ++j) {
    const uint32_t x = Load16(s->payload.data() + 4 * j) | (Load16(s->payload.data() + 4 * j + 2) << 16);
    if (x < kL) return Corrupt("initial state of lane " + std::to_string(j) + " below 2^16");
  }
  return Status::Ok();
}

}  // namespace

Status ParseStreamHeader(ByteReader& in, size_t n, StreamHeader* s) {
  s->mode = in.U8();
  if (!in.ok()) return Corrupt("truncated before mode byte");
  if (s->mode == kModeEmpty) {
    if (n != 0) return Corrupt("stream is empty but " + std::to_string(n) + " symbols were expected");
    return Status::Ok();
  }
  if (s->mode == kModeConstant) {
    const uint64_t v = in.Varint();
    if (!in.ok()) return Corrupt("truncated constant value");
    if (v > UINT32_MAX) return Corrupt("constant value exceeds 32 bits");
    s->constant = static_cast<uint32_t>(v);
    return Status::Ok();
  }
  if (s->mode != kModeRans) return Corrupt("unknown mode " + std::to_string(s->mode));

  const uint32_t e = in.U8();
  if (!in.ok()) return Corrupt("truncated escape threshold");
  if (e < kMinEscape || e > kMaxEscape) return Corrupt("escape threshold " + std::to_string(e) + " outside [2, 255]");
  uint64_t sum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint64_t f = in.Varint();
    if (!in.ok()) return Corrupt("truncated frequency table");
    if (f > kProbScale) return Corrupt("frequency " + std::to_string(f) + " exceeds 4096");
    s->freq[v] = static_cast<uint32_t>(f);
    sum += f;
  }
  if (sum != kProbScale) return Corrupt("frequency table sums to " + std::to_string(sum) + ", expected 4096");
  CG_RETURN_IF_ERROR(ParseLanesAndAreas(in, n, s));
  if (!s->esc.empty() && s->freq[e] == 0) return Corrupt("escape bytes present but the escape symbol has frequency 0");
  s->escape = e;
  s->escape_used = s->freq[e] > 0;
  return Status::Ok();
}

Status ParseTableStreamHeader(ByteReader& in, size_t n, StreamHeader* h) {
  ByteReader peek = in;
  const uint8_t mode = peek.U8();
  if (peek.ok() && mode == kModeRans) return Corrupt("a table-form stream was expected");
  if (!peek.ok() || mode != kModeTable) return ParseStreamHeader(in, n, h);  // modes 0, 1 and every error
  in = peek;
  h->mode = kModeTable;
  return ParseLanesAndAreas(in, n, h);
}

Status ParseStream(ByteReader& in, size_t n, ParsedStream* s, TableForm form) {
  StreamHeader h;
  s->n = n;
  s->form = form;
  CG_RETURN_IF_ERROR(ParseStreamHeader(in, n, &h));
  s->mode = h.mode;
  s->constant = h.constant;
  if (h.mode != kModeRans) return Status::Ok();
  s->escape = h.escape;
  s->lanes = h.lanes;
  s->esc = h.esc;
  s->payload = h.payload;
  BuildTable(h.freq.data(), h.escape, s->table.entry, form);
  s->table.escape = h.escape_used ? h.escape : kNoEscape;
  for (uint32_t j = 0; j < h.lanes; ++j)
    s->state[j] = Load16(s->payload.data() + 4 * j) | (Load16(s->payload.data() + 4 * j + 2) << 16);
  return Status::Ok();
}

Status ParseStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out,
                             TableStream* s) {
  s->n = out.size();
  s->out = out.data();
  s->cycle = cycle;
  if (cycle.empty()) return Status::Internal("rANS stream: empty table cycle");
  StreamHeader h;
  CG_RETURN_IF_ERROR(ParseTableStreamHeader(in, s->n, &h));
  s->mode = h.mode;
  s->constant = h.constant;
  s->lanes = h.lanes;
  s->esc = h.esc;
  s->payload = h.payload;
  for (uint32_t j = 0; j < h.lanes; ++j)
    s->state[j] = Load16(h.payload.data() + 4 * j) | (Load16(h.payload.data() + 4 * j + 2) << 16);
  return Status::Ok();
}

}  // namespace cachegen::rans
