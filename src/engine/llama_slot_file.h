// llama.cpp slot files (what llama-server's POST /slots/{id}?action=save
// writes, through llama_state_seq_save_file of the pinned release), and
// cachegen's compressed form of them (.cgslot).
//
// Slot file (little-endian):
//   u32 magic 0x67677371 ("ggsq"); u32 version 3; u32 n_tokens;
//   n_tokens x i32 (the server's packed prompt tokens, kept verbatim);
//   the sequence state to the end of the file: a llama_state_seq_get_data
//   blob (see llama_state.h) without its leading u32 magic and i32 seq_id.
//
// .cgslot: everything of the slot file but its KV values, plus the KV as a
// cachegen container, so restoring yields a slot file llama-server loads.
// Layout in docs/FORMAT.md, "Slot files".
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/status.h"
#include "engine/llama_state.h"

namespace cachegen::engine {

inline constexpr uint32_t kLlamaSlotMagic = 0x67677371u;  // "ggsq"
inline constexpr uint32_t kLlamaSlotVersion = 3;
inline constexpr uint32_t kCgSlotMagic = 0x4c534743u;     // "CGSL"
inline constexpr uint32_t kCgSlotVersion = 1;

struct LlamaSlotFile {
  std::vector<int32_t> tokens;
  std::span<const uint8_t> state;  // the sequence-state blob (points into the parsed bytes)
};

// Splits a slot file into tokens and state (the state is not parsed here).
Result<LlamaSlotFile> ParseLlamaSlotFile(std::span<const uint8_t> bytes);
std::vector<uint8_t> WriteLlamaSlotFile(std::span<const int32_t> tokens, std::span<const uint8_t> state);

// Compresses a slot file with `config`. kv_heads: heads per layer to split
// each row into; 0 picks head_dim 128, else 64, else the whole row. A slot
// of a quantized cache needs `quantizer` (ExtractLlamaKV; its values are
// coded as the cache stores them, Hadamard-rotated where llama.cpp rotates).
Result<std::vector<uint8_t>> CompressSlotFile(std::span<const uint8_t> slot_file, const CodecConfig& config,
                                              uint32_t kv_heads, EncodeStats* stats = nullptr,
                                              const GgmlQuantizer* quantizer = nullptr);
// Rebuilds the slot file from a .cgslot, decoding the KV at `level`; a
// .cgslot coded with a model profile needs it in `profiles`, one of a
// quantized cache `quantizer`.
Result<std::vector<uint8_t>> RestoreSlotFile(std::span<const uint8_t> cgslot, uint32_t level = 0,
                                             uint32_t threads = 0, const ProfileSet* profiles = nullptr,
                                             const GgmlQuantizer* quantizer = nullptr);

}  // namespace cachegen::engine
