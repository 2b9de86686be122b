// libFuzzer target: DecodeStream, and DecodeStreamWithTables with a fixed
// cycle of three tables, on arbitrary bytes must never crash; a successful
// decode must re-encode to a stream that decodes to the same symbols. The
// first two input bytes pick the symbol count.
#include <array>
#include <cstdint>
#include <vector>

#include "codec/rans.h"

namespace {

using namespace cachegen;

// Tables with escape thresholds 2, 9 and 40 (skewed towards 0).
struct Cycle {
  std::array<rans::FreqTable, 3> tables;
  std::array<rans::DecodeTable, 3> decode;
  std::array<const rans::FreqTable*, 3> cycle;
  std::array<const rans::DecodeTable*, 3> decode_cycle;
  Cycle() {
    const uint32_t tops[3] = {2, 9, 40};
    for (int t = 0; t < 3; ++t) {
      std::vector<uint64_t> hist(tops[t]);
      for (uint32_t v = 0; v < tops[t]; ++v) hist[v] = 1000 >> std::min<uint32_t>(v, 9);
      tables[t] = rans::MakeFreqTable(hist);
      rans::BuildDecodeTable(tables[t], &decode[t]);
      cycle[t] = &tables[t];
      decode_cycle[t] = &decode[t];
    }
  }
};

void CheckPlain(std::span<const uint8_t> in, size_t n) {
  ByteReader r(in);
  std::vector<uint32_t> out(n);
  if (!rans::DecodeStream(r, out).ok()) return;
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  rans::EncodeStream(out, w);
  ByteReader r2(buf);
  std::vector<uint32_t> again(n);
  if (!rans::DecodeStream(r2, again).ok() || again != out) __builtin_trap();
}

void CheckCycle(std::span<const uint8_t> in, size_t n) {
  static const Cycle c;
  ByteReader r(in);
  std::vector<uint32_t> out(n);
  if (!rans::DecodeStreamWithTables(r, c.decode_cycle, out).ok()) return;
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  rans::EncodeStreamWithTables(out, c.cycle, w);
  ByteReader r2(buf);
  std::vector<uint32_t> again(n);
  if (!rans::DecodeStreamWithTables(r2, c.decode_cycle, again).ok() || again != out) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = static_cast<size_t>(data[0]) * 17 + data[1];
  const std::span<const uint8_t> in(data + 2, size - 2);
  CheckPlain(in, n);
  CheckCycle(in, n);
  return 0;
}
