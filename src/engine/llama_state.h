// llama.cpp sequence-state blobs (llama_state_seq_get_data / _set_data of the
// pinned release, tag v0.4.0): parse into a layout plus byte offsets, extract
// the KV as a KVTensor, and write a blob from a KV view.
//
// Pure byte handling: nothing here includes or links llama.cpp, so it is in the
// core library and fuzzed on its own. Every length and offset is checked
// against the blob; a blob that is not exactly one well-formed state is
// kCorrupt, a well-formed one this code does not handle (mismatched K/V widths,
// quantized cache types without a GgmlQuantizer) is kUnsupported. Layout
// (little-endian), as written by llama_kv_cache::state_write:
//
//   u32 magic 0xaf143cd8; i32 seq_id
//   one or more cache sections (two for sliding-window models: base, then SWA):
//     u32 n_stream; n_stream x {
//       u32 cell_count (0: nothing more for this stream)
//       cell_count x { i32 pos; u32 n_seq_id; [cell_ext_bytes]; n_seq_id x i32 seq_id }
//       u32 v_trans; u32 n_layer
//       n_layer x { i32 k_type; u64 k_row_bytes; cell_count x k_row_bytes }
//         (a quantized row is n_embd_k_gqa / block ggml blocks)
//       v_trans 0: n_layer x { i32 v_type; u64 v_row_bytes; cell_count x v_row_bytes }
//       v_trans 1: n_layer x { i32 v_type; u32 elem_bytes; u32 n_embd_v; n_embd_v x cell_count x elem_bytes } }
//         (only unquantized V: llama.cpp needs flash attention, hence V not
//         transposed, for a quantized V cache)
//
// cell_ext_bytes is 12 (x, y, token) for models with M-RoPE or per-layer
// n-gram embeddings, 0 otherwise; the blob does not say which, so the caller
// passes it or asks for detection.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen::engine {

inline constexpr uint32_t kLlamaSeqStateMagic = 0xaf143cd8u;
inline constexpr uint32_t kLlamaCellExtBytes = 12;
// Pass as cell_ext_bytes to try 0 first, then 12.
inline constexpr uint32_t kDetectCellExt = ~0u;

// ggml type ids (ggml.h of the pinned release) of the cache types handled.
inline constexpr int32_t kGgmlF32 = 0;
inline constexpr int32_t kGgmlF16 = 1;
inline constexpr int32_t kGgmlQ4_0 = 2;
inline constexpr int32_t kGgmlQ4_1 = 3;
inline constexpr int32_t kGgmlQ5_0 = 6;
inline constexpr int32_t kGgmlQ5_1 = 7;
inline constexpr int32_t kGgmlQ8_0 = 8;
inline constexpr int32_t kGgmlIQ4_NL = 20;
inline constexpr int32_t kGgmlBF16 = 30;

// How a cache type stores values: `block` values in `block_bytes` bytes
// (1 value for f32, f16 and bf16; 32 for the quantized types).
struct GgmlCacheType {
  int32_t id;
  const char* name;
  uint32_t block;
  uint32_t block_bytes;
  bool quantized() const { return block > 1; }
};
// The cache types llama.cpp accepts for its KV cache: f32, f16, bf16, q8_0,
// q4_0, q4_1, q5_0, q5_1, iq4_nl. Null for any other id.
const GgmlCacheType* FindGgmlCacheType(int32_t type);
// By name ("q8_0"); kInvalidArgument naming the accepted ones otherwise.
Result<int32_t> GgmlCacheTypeByName(const std::string& name);
// "f32, f16, bf16, q8_0, ...": the accepted names, for messages and help.
std::string GgmlCacheTypeNames();

// "f32", "f16", "bf16", "q8_0", "type 12"...
std::string GgmlTypeName(int32_t type);
// The cachegen dtype of an unquantized ggml cache type; kUnsupported for quantized types.
Result<DType> DTypeOfGgml(int32_t type);
int32_t GgmlOfDType(DType t);

// Converts a row of quantized ggml blocks to f32 values and back. This
// library does not link ggml: the llama layer passes ggml's own routines
// (engine/llama/ggml_quantizer.h), so that a blob written here holds the
// blocks llama.cpp itself would write for those values.
class GgmlQuantizer {
 public:
  virtual ~GgmlQuantizer() = default;
  // `n` values (a multiple of the type's block) from n / block blocks at `src`.
  virtual void Dequantize(int32_t type, const uint8_t* src, float* dst, size_t n) const = 0;
  // The inverse: values that came from Dequantize give back the same blocks.
  virtual void Quantize(int32_t type, const float* src, uint8_t* dst, size_t n) const = 0;
};

// One non-empty stream of one cache section.
struct LlamaStream {
  uint32_t stream = 0;  // index within its section
  uint32_t cells = 0;
  std::vector<int32_t> pos;         // per cell
  std::vector<uint32_t> n_seq;      // per cell
  std::vector<int32_t> seq_ids;     // all cells' seq ids, in order
  std::vector<uint8_t> ext;         // cells x cell_ext_bytes
  bool v_trans = false;
  uint32_t layers = 0;
  std::vector<int32_t> k_type, v_type;          // per layer, ggml type ids
  std::vector<uint32_t> k_width, v_width;       // per layer: values per cell (n_embd_k/v_gqa)
  std::vector<uint64_t> k_offset, v_offset;     // per layer: byte offset of the data in the blob
};

struct LlamaCacheSection {
  uint32_t n_stream = 0;
  std::vector<LlamaStream> streams;  // the non-empty ones only
};

struct LlamaSeqState {
  int32_t seq_id = 0;
  uint32_t cell_ext_bytes = 0;
  std::vector<LlamaCacheSection> sections;
};

// Parses a whole blob (trailing bytes are kCorrupt).
Result<LlamaSeqState> ParseLlamaSeqState(std::span<const uint8_t> blob, uint32_t cell_ext_bytes = kDetectCellExt);

// The KV of the blob's only non-empty stream, as a contiguous tensor of
// shape (layers, kv_heads, width / kv_heads, cells), tokens in cell order.
// Its dtype is the cache's when K and V share an unquantized one, else f32
// (quantized blocks are dequantized exactly: their values are not all f16
// values). kUnsupported for several sections or streams, quantized types
// without `quantizer`, or widths that differ between K and V or layers;
// kInvalidArgument when kv_heads does not divide the width.
Result<KVTensor> ExtractLlamaKV(std::span<const uint8_t> blob, const LlamaSeqState& state, uint32_t kv_heads,
                                const GgmlQuantizer* quantizer = nullptr);

// What a blob written from scratch looks like.
struct LlamaSeqLayout {
  int32_t seq_id = 0;
  uint32_t n_stream = 1;
  uint32_t stream = 0;           // which stream holds the cells
  uint32_t cell_ext_bytes = 0;   // 0 or 12
  std::vector<uint8_t> ext;      // tokens x cell_ext_bytes; empty: zeros
  bool v_trans = false;
  int32_t k_type = kGgmlF16;     // any FindGgmlCacheType type; quantized V needs v_trans false
  int32_t v_type = kGgmlF16;
  std::vector<int32_t> pos;      // per token; empty: 0, 1, 2, ...
};

// The layout that rewrites a parsed state's only stream (same section count
// must be 1; positions, seq id, types and V layout kept).
Result<LlamaSeqLayout> LayoutOf(const LlamaSeqState& state);

// Serializes `kv` (any dtype; values rounded to the layout's types) as a blob
// of one cache section with one non-empty stream. Quantized types need
// `quantizer` (kUnsupported without) and rows of whole blocks.
Result<std::vector<uint8_t>> WriteLlamaSeqState(const LlamaSeqLayout& layout, const KVView& kv,
                                                const GgmlQuantizer* quantizer = nullptr);

}  // namespace cachegen::engine
