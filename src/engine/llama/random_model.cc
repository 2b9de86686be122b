#include "engine/llama/random_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <filesystem>

#include <ggml.h>
#include <gguf.h>
#include <llama.h>

#include "common/half.h"

namespace cachegen::engine {
namespace {

// splitmix64: a fast deterministic stream of uniform bits.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Roughly normal (sum of four uniforms, variance matched), scaled.
  float Normal(float sd) {
    const uint64_t a = Next(), b = Next();
    const double u = (double(a & 0xffffffff) + double(a >> 32) + double(b & 0xffffffff) + double(b >> 32)) /
                     4294967296.0;
    return static_cast<float>((u - 2.0) * std::sqrt(3.0) * sd);
  }
};

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

Vocab MakeVocab() {
  Vocab v;
  auto add = [&](std::string t, float score, int32_t type) {
    v.tokens.push_back(std::move(t));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, 2);  // unknown
  add("<s>", 0, 3);    // control
  add("</s>", 0, 3);
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, 6);  // byte
  }
  const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's word boundary
  add(space, -1, 1);
  for (char c = 'a'; c <= 'z'; ++c) add(space + c, -2, 1);
  for (int c = 33; c < 127; ++c) add(std::string(1, static_cast<char>(c)), -3, 1);
  return v;
}

}  // namespace

Result<RandomModelShape> RandomModelPreset(const std::string& name) {
  RandomModelShape s;
  s.name = name;
  if (name == "llama-3.2-1b") return s;
  if (name == "tiny") {
    s.layers = 2;
    s.embd = 256;
    s.heads = 4;
    s.kv_heads = 2;
    s.ffn = 512;
    s.ctx = 4096;
    s.rope_base = 10000.0;
    return s;
  }
  return Status::InvalidArgument("unknown model shape '" + name + "' (llama-3.2-1b, tiny)");
}

Result<uint64_t> WriteRandomModel(const RandomModelShape& s, const std::string& path) {
  if (s.layers == 0 || s.heads == 0 || s.kv_heads == 0 || s.embd % s.heads != 0 || s.heads % s.kv_heads != 0 ||
      s.ffn == 0 || s.layers > 1024 || s.embd > 65536 || s.ffn > 262144) {
    return Status::InvalidArgument("model shape: layers, heads and KV heads must be > 0, heads must divide the "
                                   "width and KV heads the heads");
  }
  const Vocab vocab = MakeVocab();
  const int64_t n_vocab = static_cast<int64_t>(vocab.tokens.size());
  const uint32_t head_dim = s.embd / s.heads;
  const int64_t kv_width = int64_t{s.kv_heads} * head_dim;

  gguf_context* g = gguf_init_empty();
  std::unique_ptr<gguf_context, void (*)(gguf_context*)> g_owner(g, gguf_free);
  gguf_set_val_str(g, "general.architecture", "llama");
  gguf_set_val_str(g, "general.name", ("cachegen random " + s.name).c_str());
  gguf_set_val_u32(g, "llama.context_length", s.ctx);
  gguf_set_val_u32(g, "llama.embedding_length", s.embd);
  gguf_set_val_u32(g, "llama.block_count", s.layers);
  gguf_set_val_u32(g, "llama.feed_forward_length", s.ffn);
  gguf_set_val_u32(g, "llama.attention.head_count", s.heads);
  gguf_set_val_u32(g, "llama.attention.head_count_kv", s.kv_heads);
  gguf_set_val_u32(g, "llama.rope.dimension_count", head_dim);
  gguf_set_val_f32(g, "llama.rope.freq_base", static_cast<float>(s.rope_base));
  gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_set_val_u32(g, "llama.vocab_size", static_cast<uint32_t>(n_vocab));
  gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
  std::vector<const char*> toks;
  for (const auto& t : vocab.tokens) toks.push_back(t.c_str());
  gguf_set_arr_str(g, "tokenizer.ggml.tokens", toks.data(), toks.size());
  gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, vocab.scores.data(), vocab.scores.size());
  gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, vocab.types.data(), vocab.types.size());
  gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", 0);
  gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 1);
  gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 2);

  // Tensor metadata only (no_alloc); the data is streamed to the file below.
  const size_t n_tensors = 3 + size_t{s.layers} * 9;
  ggml_init_params ip{ggml_tensor_overhead() * (n_tensors + 8), nullptr, true};
  ggml_context* ctx = ggml_init(ip);
  if (!ctx) return Status::Internal("ggml_init failed");
  std::unique_ptr<ggml_context, void (*)(ggml_context*)> ctx_owner(ctx, ggml_free);
  const ggml_type wt = s.f16_weights ? GGML_TYPE_F16 : GGML_TYPE_F32;
  struct Spec {
    ggml_tensor* t;
    float sd;  // 0: a norm weight, all ones
  };
  std::vector<Spec> specs;
  auto mat = [&](const std::string& name, int64_t in, int64_t out, float sd) {
    ggml_tensor* t = ggml_new_tensor_2d(ctx, wt, in, out);
    ggml_set_name(t, name.c_str());
    gguf_add_tensor(g, t);
    specs.push_back({t, sd});
  };
  auto norm = [&](const std::string& name) {
    ggml_tensor* t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.embd);
    ggml_set_name(t, name.c_str());
    gguf_add_tensor(g, t);
    specs.push_back({t, 0});
  };
  const float sd = 1.0f / std::sqrt(static_cast<float>(s.embd));
  mat("token_embd.weight", s.embd, n_vocab, 1.0f);
  norm("output_norm.weight");
  mat("output.weight", s.embd, n_vocab, sd);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    mat(p + "attn_q.weight", s.embd, s.embd, sd);
    mat(p + "attn_k.weight", s.embd, kv_width, sd);
    mat(p + "attn_v.weight", s.embd, kv_width, sd);
    mat(p + "attn_output.weight", s.embd, s.embd, sd);
    norm(p + "ffn_norm.weight");
    mat(p + "ffn_gate.weight", s.embd, s.ffn, sd);
    mat(p + "ffn_up.weight", s.embd, s.ffn, sd);
    mat(p + "ffn_down.weight", s.ffn, s.embd, 1.0f / std::sqrt(static_cast<float>(s.ffn)));
  }

  if (!gguf_write_to_file(g, path.c_str(), /*only_meta=*/true)) {
    return Status::IOError("cannot write '" + path + "'");
  }
  FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return Status::IOError("cannot append to '" + path + "'");
  Rng rng{s.seed};
  const size_t data_start = gguf_get_meta_size(g);
  size_t written = 0;
  std::vector<uint8_t> buf;
  bool ok = true;
  for (size_t i = 0; i < specs.size() && ok; ++i) {
    const size_t offset = gguf_get_tensor_offset(g, static_cast<int64_t>(i));
    if (offset > written) {  // alignment padding
      buf.assign(offset - written, 0);
      ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
      written = offset;
    }
    const ggml_tensor* t = specs[i].t;
    const int64_t n = ggml_nelements(t);
    const size_t es = t->type == GGML_TYPE_F16 ? 2 : 4;
    constexpr int64_t kBlock = 1 << 20;
    for (int64_t at = 0; at < n && ok; at += kBlock) {
      const int64_t m = std::min(kBlock, n - at);
      buf.resize(static_cast<size_t>(m) * es);
      for (int64_t j = 0; j < m; ++j) {
        const float v = specs[i].sd == 0 ? 1.0f : rng.Normal(specs[i].sd);
        if (es == 2) {
          const uint16_t h = F32ToF16(v);
          std::memcpy(buf.data() + j * 2, &h, 2);
        } else {
          std::memcpy(buf.data() + j * 4, &v, 4);
        }
      }
      ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
    }
    written += ggml_nbytes(t);
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return Status::IOError("write to '" + path + "' failed");
  return static_cast<uint64_t>(data_start + written);
}

Result<uint64_t> QuantizeModel(const std::string& in, const std::string& out, const std::string& type) {
  llama_model_quantize_params qp = llama_model_quantize_default_params();
  if (type == "q8_0") {
    qp.ftype = LLAMA_FTYPE_MOSTLY_Q8_0;
  } else if (type == "q4_0") {
    qp.ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
  } else if (type == "q4_k_m") {
    qp.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M;
  } else {
    return Status::InvalidArgument("unknown weight type '" + type + "' (q8_0, q4_0, q4_k_m)");
  }
  if (in == out) return Status::InvalidArgument("quantize: input and output are the same file");
  llama_backend_init();
  if (llama_model_quantize(in.c_str(), out.c_str(), &qp) != 0)
    return Status::Internal("llama.cpp could not quantize '" + in + "' to " + type);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(out, ec);
  if (ec) return Status::IOError("cannot stat '" + out + "'");
  return static_cast<uint64_t>(size);
}

}  // namespace cachegen::engine
