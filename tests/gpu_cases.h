// The codec settings and shapes the CUDA decoder must decode bit-identically
// to the CPU decoder: shared by gpu_plan_test (host run of the device code)
// and cuda_decoder_test (the device itself).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "codec/cachegen/gpu_plan.h"
#include "format/frame.h"
#include "kv/synthetic.h"

namespace cachegen::gpu_test {

enum class Layout { kContiguous, kPadded, kPaged };

struct GpuCase {
  std::string name;
  KVShape shape;
  CodecConfig cfg;
  DType out = DType::kF16;
  Layout layout = Layout::kContiguous;
  bool zeros = false;        // all-zero KV: constant symbol streams
  uint32_t token_start = 0;  // absolute position of the first token
  bool emulate = true;       // gpu_plan_test also runs it on an emulated warp (32 threads per job)
};

inline CodecConfig Cfg(double bits, uint32_t chunk, uint32_t group = 0, bool rotate = false) {
  CodecConfig c;
  c.bits_per_value = bits;
  c.chunk_tokens = chunk;
  c.group_tokens = group;
  c.rotate = rotate;
  c.threads = 1;
  return c;
}

inline std::vector<GpuCase> GpuCases() {
  std::vector<GpuCase> v;
  const KVShape small{2, 2, 32, 64};
  for (int bits = 1; bits <= 8; ++bits) v.push_back({"bits" + std::to_string(bits), small, Cfg(bits, 32)});
  for (uint32_t g : {1u, 2u, 4u}) {
    v.push_back({"group" + std::to_string(g), small, Cfg(3, 32, g)});
    v.push_back({"group" + std::to_string(g) + "_rotate", small, Cfg(3, 32, g, true)});
  }
  for (double r : {0.5, 0.0})
    for (bool rotate : {false, true}) {
      GpuCase c{std::string("recent_r") + (r == 0 ? "0" : "half") + (rotate ? "_rotate" : ""), small,
                Cfg(2, 32, 2, rotate)};
      c.cfg.recent_tokens = 40;
      c.cfg.recent_step_scale = r;
      v.push_back(c);
    }
  v.push_back({"odd_tokens", {2, 3, 24, 37}, Cfg(2, 16, 4)});
  v.push_back({"one_token_chunks", {1, 2, 16, 5}, Cfg(3, 1, 2)});
  v.push_back({"one_token_chunks_exact", {1, 2, 16, 3}, Cfg(3, 1, 2)});
  v.back().cfg.recent_tokens = 2;
  v.back().cfg.recent_step_scale = 0;
  v.push_back({"dim8", {1, 4, 8, 33}, Cfg(4, 0, 2, true)});
  v.push_back({"dim6_odd_heads", {1, 5, 6, 19}, Cfg(4, 0, 3)});
  v.push_back({"dim256", {1, 1, 256, 20}, Cfg(2, 0, 2, true)});
  v.push_back({"llama_like", {3, 8, 128, 40}, Cfg(2, 16)});
  v.back().emulate = false;
  v.push_back({"bf16_out", small, Cfg(2, 32, 2, true), DType::kBF16});
  v.push_back({"f32_out", small, Cfg(2, 32), DType::kF32});
  GpuCase levels{"levels3", small, Cfg(4, 32)};
  levels.cfg.levels = 3;
  v.push_back(levels);
  for (auto kind : {RopeConfig::Kind::kNormal, RopeConfig::Kind::kNeox})
    for (uint32_t dims : {32u, 16u}) {
      GpuCase c{std::string(kind == RopeConfig::Kind::kNeox ? "rope_neox" : "rope_normal") + std::to_string(dims),
                small, Cfg(3, 32, 2, dims == 16)};
      c.cfg.rope.kind = kind;
      c.cfg.rope.dims = dims;
      c.cfg.recent_tokens = 10;
      c.cfg.recent_step_scale = 0;
      c.token_start = 1000;
      v.push_back(c);
    }
  GpuCase zeros{"zeros_constant_streams", small, Cfg(2, 32)};
  zeros.zeros = true;
  v.push_back(zeros);
  GpuCase err{"max_error", small, Cfg(0, 32)};
  err.cfg.max_rel_error = 0.05;
  v.push_back(err);
  GpuCase snr{"snr", small, Cfg(0, 32, 2, true)};
  snr.cfg.snr_db = 30;
  v.push_back(snr);
  v.push_back({"padded_rows", small, Cfg(2, 32), DType::kF16, Layout::kPadded});
  v.push_back({"paged", {2, 2, 32, 70}, Cfg(2, 32, 2, true), DType::kBF16, Layout::kPaged});
  return v;
}

inline void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<uint8_t> EncodeCase(const GpuCase& c) {
  KVTensor kv(c.shape, DType::kF16);
  if (!c.zeros) {
    SyntheticOptions o;
    o.token_start = c.token_start;
    o.rope = c.shape.head_dim % 2 == 0;
    auto syn = SyntheticKV(c.shape, DType::kF16, 7, o);
    EXPECT_TRUE(syn.ok()) << syn.status().ToString();
    kv = std::move(*syn);
  }
  auto enc = Encoder::Create(c.cfg);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  auto bytes = enc->Encode(kv.view(), nullptr, c.token_start);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

inline gpu::OutputLayout CaseLayout(const GpuCase& c) {
  const KVShape& s = c.shape;
  const int64_t C = int64_t{s.kv_heads} * s.head_dim;
  gpu::OutputLayout o = gpu::ContiguousLayout(s, c.out);
  if (c.layout == Layout::kPadded) {
    // llama.cpp-like: per layer a K and a V buffer of token rows, more cells than tokens.
    const int64_t cells = s.tokens + 7;
    o.strides = {2 * cells * C, cells * C, C, s.head_dim, 1};
    o.capacity = s.layers * 2 * cells * C;
  } else if (c.layout == Layout::kPaged) {
    // Pages of 16 tokens holding every layer, placed in reverse order.
    o.page_tokens = 16;
    const int64_t pages = (s.tokens + 15) / 16, page = int64_t{s.layers} * 2 * 16 * C;
    o.strides = {2 * 16 * C, 16 * C, C, s.head_dim, 1};
    for (int64_t p = 0; p < pages; ++p) o.page_offsets.push_back((pages - 1 - p) * page);
    o.capacity = pages * page;
  }
  return o;
}

// A host buffer for a layout, every byte 0xA5 (so unwritten elements show).
inline std::vector<uint8_t> Buffer(const gpu::OutputLayout& o) {
  return std::vector<uint8_t>(o.capacity * DTypeSize(o.dtype), 0xA5);
}

// The CPU decoder's output in the layout.
inline Status ReferenceDecode(std::span<const uint8_t> container, uint32_t level, const gpu::OutputLayout& o,
                              std::vector<uint8_t>* buf) {
  *buf = Buffer(o);
  CG_ASSIGN_OR_RETURN(Decoder d, Decoder::Open(container));
  const KVView view(buf->data(), o.dtype, o.shape, o.strides, KVPaging{o.page_tokens, o.page_offsets});
  return d.Decode(view, level, 1);
}

// A frame's header and section payloads, to rebuild with changes (WriteFrame).
struct FrameParts {
  FrameHeader header;
  std::vector<EncodedSection> sections;
};

inline FrameParts SplitFrame(const std::vector<uint8_t>& frame) {
  auto p = ParseFrame(frame);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return {};
  FrameParts parts{p->header, {}};
  for (uint32_t i = 0; i < p->sections.size(); ++i) {
    auto payload = SectionPayload(*p, frame, i / 2, static_cast<KV>(i % 2));
    parts.sections.push_back({std::vector<uint8_t>(payload->begin(), payload->end()), p->sections[i].side_bytes});
  }
  return parts;
}

// Empty when equal, else where the first difference is.
inline std::string FirstDifference(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  if (want.size() != got.size()) return "sizes differ";
  const auto it = std::mismatch(want.begin(), want.end(), got.begin());
  if (it.first == want.end()) return "";
  return "first difference at byte " + std::to_string(it.first - want.begin()) + ": want " +
         std::to_string(*it.first) + ", got " + std::to_string(*it.second);
}

}  // namespace cachegen::gpu_test
