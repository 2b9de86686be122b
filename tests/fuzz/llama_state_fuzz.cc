// libFuzzer target: the llama.cpp sequence-state parser on arbitrary bytes.
// Parsing must return ok or a Status, never crash or over-allocate; a parsed
// blob must extract, rewrite and parse back to the same layout.
#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/llama_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cachegen::engine;
  std::span<const uint8_t> blob(data, size);
  auto st = ParseLlamaSeqState(blob);
  if (!st.ok()) return 0;
  auto kv = ExtractLlamaKV(blob, *st, 1);
  auto layout = LayoutOf(*st);
  if (kv.ok() && layout.ok()) {
    auto again = WriteLlamaSeqState(*layout, kv->view());
    if (!again.ok()) __builtin_trap();
    auto back = ParseLlamaSeqState(*again, st->cell_ext_bytes);
    if (!back.ok() || back->sections.size() != 1 || back->sections[0].streams.size() != 1) __builtin_trap();
    if (back->sections[0].streams[0].cells != st->sections[0].streams[0].cells) __builtin_trap();
  }
  return 0;
}
