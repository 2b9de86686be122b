#include "engine/llama/cache_rotation.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "engine/llama_state.h"

namespace cachegen {
namespace {

// In place: x (n values, n a power of two) times the normalized
// Sylvester-order Hadamard matrix, by the fast transform's butterflies.
void Hadamard(float* x, uint32_t n) {
  for (uint32_t h = 1; h < n; h *= 2) {
    for (uint32_t i = 0; i < n; i += 2 * h) {
      for (uint32_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (uint32_t i = 0; i < n; ++i) x[i] *= scale;
}

bool Quantized(const std::string& type) {
  const auto id = engine::GgmlCacheTypeByName(type);
  return id.ok() && engine::FindGgmlCacheType(*id)->quantized();
}

}  // namespace

CacheRotation CacheRotationOf(const LlamaModelInfo& info, const LlamaCacheTypes& cache) {
  CacheRotation r;
  const char* off = std::getenv("LLAMA_ATTN_ROT_DISABLE");  // read by llama.cpp the same way
  if ((off && std::atoi(off) != 0) || info.head_dim == 0 || info.head_dim % 64 != 0) return r;
  if (Quantized(cache.k)) {
    // The largest power of two that divides the head dim (llama_kv_cache::build_input_k_rot).
    r.k_block = 64;
    while (info.head_dim % (r.k_block * 2) == 0) r.k_block *= 2;
  }
  if (Quantized(cache.v)) r.v_block = 64;  // llama_kv_cache::build_input_v_rot
  return r;
}

namespace engine {

void ApplyCacheRotation(const CacheRotation& r, const KVView& kv) {
  const KVShape& s = kv.shape();
  std::vector<float> row(s.channels());
  for (KV part : {KV::kKey, KV::kValue}) {
    const uint32_t block = part == KV::kKey ? r.k_block : r.v_block;
    if (block == 0 || s.head_dim % block != 0) continue;
    for (uint32_t l = 0; l < s.layers; ++l) {
      for (uint32_t t = 0; t < s.tokens; ++t) {
        kv.ReadRow(l, part, t, row.data());
        for (size_t at = 0; at < row.size(); at += block) Hadamard(row.data() + at, block);
        kv.WriteRow(l, part, t, row.data());
      }
    }
  }
}

}  // namespace engine
}  // namespace cachegen
