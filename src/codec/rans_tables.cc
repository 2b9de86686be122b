// Decode tables: a frequency table's slots as the decoders look them up
// (TableForm), built scalar or with AVX2.
#include <cstdint>

#include "codec/rans.h"
#include "codec/rans_internal.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen::rans {

using internal::BuildTable;

namespace {

// table[cum[v] + k] = Entry(v) + (k << shift) for k < freq[v] (symbols with
// frequency 0 take no slots; freq sums to kProbScale), with the entry layout
// of `form` (rans.h TableForm).
struct EntryLayout {
  uint32_t shift;  // where the slot offset k goes
  uint32_t Entry(uint32_t v, uint32_t f, uint32_t e, bool values) const {
    if (!values) return v | ((f - 1) << 8);
    // ZigZag-decoded value of a direct symbol (v < e <= 255: in [-127, 127]);
    // the escape symbol is marked -128.
    const int32_t q = v == e ? -128 : static_cast<int32_t>(v >> 1) ^ -static_cast<int32_t>(v & 1);
    return ((f - 1) << 12) | (static_cast<uint32_t>(q) << 24);
  }
};

void BuildTableScalar(const uint32_t* freq, uint32_t e, uint32_t* table, TableForm form) {
  const bool values = form == TableForm::kZigZagValues;
  const EntryLayout lay{values ? 0u : 20u};
  uint32_t cum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint32_t base = lay.Entry(v, freq[v], e, values);
    for (uint32_t k = 0; k < freq[v]; ++k) table[cum + k] = base + (k << lay.shift);
    cum += freq[v];
  }
}

#if defined(__x86_64__)
// The same entries, eight per store.
__attribute__((target("avx2"))) void BuildTableAvx2(const uint32_t* freq, uint32_t e, uint32_t* table,
                                                   TableForm form) {
  const bool values = form == TableForm::kZigZagValues;
  const EntryLayout lay{values ? 0u : 20u};
  const int sh = static_cast<int>(lay.shift);
  const __m256i iota = _mm256_setr_epi32(0, 1 << sh, 2 << sh, 3 << sh, 4 << sh, 5 << sh, 6 << sh, 7 << sh);
  const __m256i step = _mm256_set1_epi32(8 << sh);
  uint32_t cum = 0;
  for (uint32_t v = 0; v <= e; ++v) {
    const uint32_t f = freq[v];
    const uint32_t base = lay.Entry(v, f, e, values);
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), iota);
    uint32_t k = 0;
    for (; k + 8 <= f; k += 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(table + cum + k), x);
      x = _mm256_add_epi32(x, step);
    }
    for (; k < f; ++k) table[cum + k] = base + (k << lay.shift);
    cum += f;
  }
}
#endif

}  // namespace

namespace internal {

void BuildTable(const uint32_t* freq, uint32_t e, uint32_t* table, TableForm form) {
#if defined(__x86_64__)
  if (simd::Avx2()) return BuildTableAvx2(freq, e, table, form);
#endif
  BuildTableScalar(freq, e, table, form);
}

}  // namespace internal

void BuildDecodeTable(const FreqTable& table, DecodeTable* out) {
  BuildTable(table.freq.data(), table.escape, out->entry, TableForm::kSymbols);
  out->escape = table.escape;
}

void BuildValueTable(const FreqTable& table, uint32_t* entries) {
  BuildTable(table.freq.data(), table.escape, entries, TableForm::kZigZagValues);
}

}  // namespace cachegen::rans
