// Random-weight GGUF models of a chosen shape (llama architecture), written
// with the gguf/ggml API of the linked llama.cpp. Their outputs mean nothing;
// they exercise shapes, sizes and speed where no trained model of that shape
// can be shipped. The vocabulary is a small byte-fallback SentencePiece-style
// one (control tokens, 256 byte tokens, printable ASCII, "▁"-prefixed letters).
#pragma once

#include <cstdint>
#include <string>

#include "cachegen/status.h"

namespace cachegen::engine {

struct RandomModelShape {
  std::string name;
  uint32_t layers = 16;
  uint32_t embd = 2048;
  uint32_t heads = 32;
  uint32_t kv_heads = 8;
  uint32_t ffn = 8192;
  uint32_t ctx = 131072;
  double rope_base = 500000.0;
  bool f16_weights = true;  // matrices in f16 (norms always f32)
  uint64_t seed = 1;
};

// "llama-3.2-1b": 16 layers, 2048 wide, 32 heads, 8 KV heads (head dim 64),
// feed-forward 8192, RoPE base 500000 (vocabulary small, see above).
// "tiny": 2 layers, 256 wide, 4 heads, 2 KV heads (head dim 64), ffn 512.
Result<RandomModelShape> RandomModelPreset(const std::string& name);

// Writes the model to `path`; returns the file size.
Result<uint64_t> WriteRandomModel(const RandomModelShape& shape, const std::string& path);

// Rewrites the GGUF model `in` with its weight matrices in `type` through
// llama.cpp's own quantizer (llama_model_quantize): "q8_0", "q4_0" or
// "q4_k_m" (the mix llama.cpp users most often run). Returns the file size.
Result<uint64_t> QuantizeModel(const std::string& in, const std::string& out, const std::string& type);

}  // namespace cachegen::engine
