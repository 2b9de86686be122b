#include "engine/llama_state.h"

#include <cstring>
#include <limits>

#include "common/bytes.h"
#include "common/half.h"

namespace cachegen::engine {
namespace {

// Bytes per element of the unquantized types; 0 for others.
size_t ElemBytes(int32_t type) {
  switch (type) {
    case kGgmlF32: return 4;
    case kGgmlF16: return 2;
    case kGgmlBF16: return 2;
    default: return 0;
  }
}

Status TypeOk(int32_t type, const char* what, uint32_t layer) {
  if (ElemBytes(type) != 0) return Status::Ok();
  if (type < 0 || type >= 64) {
    return Status::Corrupt("llama state: " + std::string(what) + " of layer " + std::to_string(layer) +
                           " has unknown ggml type " + std::to_string(type));
  }
  return Status::Unsupported("llama state: " + std::string(what) + " cache type " + GgmlTypeName(type) +
                             " is quantized; only f32, f16 and bf16 caches are supported");
}

// Checks a K or V row header (type and row bytes) of layer l against the
// cells still to come; sets the row's width in values.
Status CheckRow(const char* what, int32_t type, uint64_t row, uint32_t l, uint32_t cells, size_t remaining,
                uint32_t* width) {
  CG_RETURN_IF_ERROR(TypeOk(type, what, l));
  const size_t eb = ElemBytes(type);
  if (row == 0 || row % eb != 0 || row / eb > std::numeric_limits<uint32_t>::max()) {
    return Status::Corrupt("llama state: " + std::string(what) + " row of layer " + std::to_string(l) + " has " +
                           std::to_string(row) + " bytes");
  }
  if (row > remaining / cells) {
    return Status::Corrupt("llama state: " + std::string(what) + " data of layer " + std::to_string(l) +
                           " out of bounds");
  }
  *width = static_cast<uint32_t>(row / eb);
  return Status::Ok();
}

// Parses one stream after its cell_count. `cells` > 0.
Status ParseStream(ByteReader& r, uint32_t cells, uint32_t ext_bytes, LlamaStream* s) {
  s->cells = cells;
  // Each cell takes at least 12 bytes: refuse counts the rest of the blob cannot hold
  // before allocating for them.
  if (uint64_t{cells} * (12 + ext_bytes) > r.remaining()) {
    return Status::Corrupt("llama state: " + std::to_string(cells) + " cells do not fit in the blob");
  }
  s->pos.resize(cells);
  s->n_seq.resize(cells);
  s->ext.resize(size_t{cells} * ext_bytes);
  for (uint32_t i = 0; i < cells; ++i) {
    s->pos[i] = static_cast<int32_t>(r.U32());
    const uint32_t n = r.U32();
    s->n_seq[i] = n;
    if (ext_bytes) {
      auto e = r.Bytes(ext_bytes);
      if (!e.empty()) std::memcpy(s->ext.data() + size_t{i} * ext_bytes, e.data(), ext_bytes);
    }
    if (!r.ok()) return Status::Corrupt("llama state: truncated cell metadata");
    if (uint64_t{n} * 4 > r.remaining()) return Status::Corrupt("llama state: cell seq id count out of bounds");
    for (uint32_t j = 0; j < n; ++j) s->seq_ids.push_back(static_cast<int32_t>(r.U32()));
  }
  const uint32_t v_trans = r.U32();
  const uint32_t layers = r.U32();
  if (!r.ok()) return Status::Corrupt("llama state: truncated stream header");
  if (v_trans > 1) return Status::Corrupt("llama state: v_trans is " + std::to_string(v_trans));
  if (layers == 0 || uint64_t{layers} * 24 > r.remaining()) {
    return Status::Corrupt("llama state: layer count " + std::to_string(layers) + " out of bounds");
  }
  s->v_trans = v_trans == 1;
  s->layers = layers;
  for (uint32_t l = 0; l < layers; ++l) {
    const int32_t type = static_cast<int32_t>(r.U32());
    const uint64_t row = r.U64();
    if (!r.ok()) return Status::Corrupt("llama state: truncated K header");
    uint32_t width;
    CG_RETURN_IF_ERROR(CheckRow("K", type, row, l, cells, r.remaining(), &width));
    s->k_type.push_back(type);
    s->k_width.push_back(width);
    s->k_offset.push_back(r.position());
    r.Bytes(row * cells);
  }
  for (uint32_t l = 0; l < layers; ++l) {
    const int32_t type = static_cast<int32_t>(r.U32());
    if (!r.ok()) return Status::Corrupt("llama state: truncated V header");
    uint64_t bytes;
    uint32_t width;
    if (!s->v_trans) {
      const uint64_t row = r.U64();
      if (!r.ok()) return Status::Corrupt("llama state: truncated V header");
      CG_RETURN_IF_ERROR(CheckRow("V", type, row, l, cells, r.remaining(), &width));
      bytes = row * cells;
    } else {
      const uint32_t elem = r.U32();
      width = r.U32();
      if (!r.ok()) return Status::Corrupt("llama state: truncated V header");
      CG_RETURN_IF_ERROR(TypeOk(type, "V", l));
      if (elem != ElemBytes(type)) {
        return Status::Corrupt("llama state: V element size " + std::to_string(elem) + " does not match type " +
                               GgmlTypeName(type));
      }
      if (width == 0 || uint64_t{width} * elem > r.remaining() / cells) {
        return Status::Corrupt("llama state: V data of layer " + std::to_string(l) + " out of bounds");
      }
      bytes = uint64_t{width} * elem * cells;
    }
    s->v_type.push_back(type);
    s->v_width.push_back(width);
    s->v_offset.push_back(r.position());
    r.Bytes(bytes);
  }
  if (!r.ok()) return Status::Corrupt("llama state: truncated V data");
  return Status::Ok();
}

Result<LlamaSeqState> Parse(std::span<const uint8_t> blob, uint32_t ext_bytes) {
  ByteReader r(blob);
  const uint32_t magic = r.U32();
  LlamaSeqState st;
  st.seq_id = static_cast<int32_t>(r.U32());
  st.cell_ext_bytes = ext_bytes;
  if (!r.ok()) return Status::Corrupt("llama state: blob of " + std::to_string(blob.size()) + " bytes is too short");
  if (magic != kLlamaSeqStateMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "llama state: magic 0x%08x, expected 0x%08x", magic, kLlamaSeqStateMagic);
    return Status::Corrupt(buf);
  }
  if (r.remaining() == 0) return Status::Corrupt("llama state: no cache section");
  while (r.remaining() > 0) {
    LlamaCacheSection sec;
    sec.n_stream = r.U32();
    if (!r.ok()) return Status::Corrupt("llama state: truncated cache section");
    if (sec.n_stream == 0 || uint64_t{sec.n_stream} * 4 > r.remaining()) {
      return Status::Corrupt("llama state: stream count " + std::to_string(sec.n_stream) + " out of bounds");
    }
    for (uint32_t s = 0; s < sec.n_stream; ++s) {
      const uint32_t cells = r.U32();
      if (!r.ok()) return Status::Corrupt("llama state: truncated stream " + std::to_string(s));
      if (cells == 0) continue;
      LlamaStream stream;
      stream.stream = s;
      CG_RETURN_IF_ERROR(ParseStream(r, cells, ext_bytes, &stream));
      sec.streams.push_back(std::move(stream));
    }
    st.sections.push_back(std::move(sec));
  }
  return st;
}

void StoreValue(uint8_t* p, int32_t type, float v) {
  if (type == kGgmlF32) {
    std::memcpy(p, &v, 4);
  } else {
    const uint16_t h = type == kGgmlF16 ? F32ToF16(v) : F32ToBF16(v);
    std::memcpy(p, &h, 2);
  }
}

float LoadValue(const uint8_t* p, int32_t type) {
  if (type == kGgmlF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return type == kGgmlF16 ? F16ToF32(h) : BF16ToF32(h);
}

// Whether row (layer, kv, token) of `v` is channels() contiguous elements of
// ggml type `type`: then its bytes are copied as they are, no conversion.
bool RawRows(const KVView& v, int32_t type) {
  const KVShape& s = v.shape();
  if (ElemBytes(type) != DTypeSize(v.dtype())) return false;
  const bool same_type = (type == kGgmlF32 && v.dtype() == DType::kF32) ||
                         (type == kGgmlF16 && v.dtype() == DType::kF16) ||
                         (type == kGgmlBF16 && v.dtype() == DType::kBF16);
  return same_type && v.strides().dim == 1 && (s.kv_heads == 1 || v.strides().head == int64_t{s.head_dim});
}

}  // namespace

std::string GgmlTypeName(int32_t type) {
  switch (type) {
    case kGgmlF32: return "f32";
    case kGgmlF16: return "f16";
    case kGgmlBF16: return "bf16";
    case kGgmlQ8_0: return "q8_0";
    case kGgmlQ4_0: return "q4_0";
    case 3: return "q4_1";
    case 6: return "q5_0";
    case 7: return "q5_1";
    case 20: return "iq4_nl";
    default: return "type " + std::to_string(type);
  }
}

Result<DType> DTypeOfGgml(int32_t type) {
  switch (type) {
    case kGgmlF32: return DType::kF32;
    case kGgmlF16: return DType::kF16;
    case kGgmlBF16: return DType::kBF16;
    default:
      return Status::Unsupported("llama state: cache type " + GgmlTypeName(type) +
                                 " is not supported (only f32, f16, bf16)");
  }
}

int32_t GgmlOfDType(DType t) {
  switch (t) {
    case DType::kF32: return kGgmlF32;
    case DType::kBF16: return kGgmlBF16;
    case DType::kF16: break;
  }
  return kGgmlF16;
}

Result<LlamaSeqState> ParseLlamaSeqState(std::span<const uint8_t> blob, uint32_t cell_ext_bytes) {
  if (cell_ext_bytes != kDetectCellExt) {
    if (cell_ext_bytes != 0 && cell_ext_bytes != kLlamaCellExtBytes) {
      return Status::InvalidArgument("llama state: cell_ext_bytes must be 0 or 12");
    }
    return Parse(blob, cell_ext_bytes);
  }
  auto plain = Parse(blob, 0);
  if (plain.ok() || plain.status().code() != StatusCode::kCorrupt) return plain;
  auto ext = Parse(blob, kLlamaCellExtBytes);
  if (ext.ok()) return ext;
  return plain;  // report the error of the common layout
}

Result<KVTensor> ExtractLlamaKV(std::span<const uint8_t> blob, const LlamaSeqState& state, uint32_t kv_heads) {
  if (state.sections.size() != 1) {
    return Status::Unsupported("llama state: " + std::to_string(state.sections.size()) +
                               " cache sections (sliding-window models) are not supported");
  }
  const auto& sec = state.sections[0];
  if (sec.streams.size() != 1) {
    return Status::Unsupported("llama state: " + std::to_string(sec.streams.size()) +
                               " non-empty streams; capture one sequence at a time");
  }
  const LlamaStream& s = sec.streams[0];
  const uint32_t width = s.k_width[0];
  for (uint32_t l = 0; l < s.layers; ++l) {
    if (s.k_width[l] != width || s.v_width[l] != width) {
      return Status::Unsupported("llama state: K/V widths differ across layers or between K and V (layer " +
                                 std::to_string(l) + ")");
    }
    CG_RETURN_IF_ERROR(DTypeOfGgml(s.k_type[l]).status());
    CG_RETURN_IF_ERROR(DTypeOfGgml(s.v_type[l]).status());
  }
  if (kv_heads == 0 || width % kv_heads != 0) {
    return Status::InvalidArgument("llama state: " + std::to_string(kv_heads) + " KV heads do not divide width " +
                                   std::to_string(width));
  }
  bool same = true;
  for (uint32_t l = 0; l < s.layers; ++l) same = same && s.k_type[l] == s.k_type[0] && s.v_type[l] == s.k_type[0];
  const DType dtype = same ? *DTypeOfGgml(s.k_type[0]) : DType::kF32;
  // The state may come from another blob: its offsets must lie inside this one.
  for (uint32_t l = 0; l < s.layers; ++l) {
    const uint64_t kbytes = uint64_t{s.cells} * width * ElemBytes(s.k_type[l]);
    const uint64_t vbytes = uint64_t{s.cells} * width * ElemBytes(s.v_type[l]);
    if (s.k_offset[l] > blob.size() || kbytes > blob.size() - s.k_offset[l] || s.v_offset[l] > blob.size() ||
        vbytes > blob.size() - s.v_offset[l]) {
      return Status::InvalidArgument("llama state: the parsed state does not belong to this blob");
    }
  }

  KVShape shape{s.layers, kv_heads, width / kv_heads, s.cells};
  CG_RETURN_IF_ERROR(shape.Validate());
  KVTensor out(shape, dtype);
  KVView view = out.view();
  std::vector<float> row(width);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const size_t kb = ElemBytes(s.k_type[l]);
    const uint8_t* k = blob.data() + s.k_offset[l];
    const bool raw_k = RawRows(view, s.k_type[l]);
    for (uint32_t t = 0; t < s.cells; ++t) {
      const uint8_t* p = k + size_t{t} * width * kb;
      if (raw_k) {
        std::memcpy(view.Pointer(l, KV::kKey, t, 0, 0), p, size_t{width} * kb);
        continue;
      }
      for (uint32_t c = 0; c < width; ++c) row[c] = LoadValue(p + c * kb, s.k_type[l]);
      view.WriteRow(l, KV::kKey, t, row.data());
    }
    const size_t vb = ElemBytes(s.v_type[l]);
    const uint8_t* v = blob.data() + s.v_offset[l];
    const bool raw_v = RawRows(view, s.v_type[l]);
    for (uint32_t t = 0; t < s.cells; ++t) {
      if (raw_v) {
        auto* dst = static_cast<uint8_t*>(view.Pointer(l, KV::kValue, t, 0, 0));
        if (!s.v_trans) {
          std::memcpy(dst, v + size_t{t} * width * vb, size_t{width} * vb);
        } else {
          for (uint32_t c = 0; c < width; ++c) std::memcpy(dst + c * vb, v + (size_t{c} * s.cells + t) * vb, vb);
        }
        continue;
      }
      for (uint32_t c = 0; c < width; ++c) {
        const size_t idx = s.v_trans ? size_t{c} * s.cells + t : size_t{t} * width + c;
        row[c] = LoadValue(v + idx * vb, s.v_type[l]);
      }
      view.WriteRow(l, KV::kValue, t, row.data());
    }
  }
  return out;
}

Result<LlamaSeqLayout> LayoutOf(const LlamaSeqState& state) {
  if (state.sections.size() != 1 || state.sections[0].streams.size() != 1) {
    return Status::Unsupported("llama state: only one cache section with one non-empty stream can be rewritten");
  }
  const auto& sec = state.sections[0];
  const LlamaStream& s = sec.streams[0];
  for (uint32_t n : s.n_seq) {
    if (n != 1) return Status::Unsupported("llama state: cells shared by several sequences cannot be rewritten");
  }
  for (uint32_t l = 1; l < s.layers; ++l) {
    if (s.k_type[l] != s.k_type[0] || s.v_type[l] != s.v_type[0]) {
      return Status::Unsupported("llama state: cache types differ across layers");
    }
  }
  LlamaSeqLayout out;
  out.seq_id = s.seq_ids.empty() ? state.seq_id : s.seq_ids[0];
  out.n_stream = sec.n_stream;
  out.stream = s.stream;
  out.cell_ext_bytes = state.cell_ext_bytes;
  out.ext = s.ext;
  out.v_trans = s.v_trans;
  out.k_type = s.k_type[0];
  out.v_type = s.v_type[0];
  out.pos = s.pos;
  return out;
}

Result<std::vector<uint8_t>> WriteLlamaSeqState(const LlamaSeqLayout& layout, const KVView& kv) {
  const KVShape& shape = kv.shape();
  CG_RETURN_IF_ERROR(shape.Validate());
  if (ElemBytes(layout.k_type) == 0 || ElemBytes(layout.v_type) == 0) {
    return Status::Unsupported("llama state: cannot write cache types " + GgmlTypeName(layout.k_type) + "/" +
                               GgmlTypeName(layout.v_type) + " (only f32, f16, bf16)");
  }
  if (layout.n_stream == 0 || layout.stream >= layout.n_stream) {
    return Status::InvalidArgument("llama state: stream index out of range");
  }
  if (layout.cell_ext_bytes != 0 && layout.cell_ext_bytes != kLlamaCellExtBytes) {
    return Status::InvalidArgument("llama state: cell_ext_bytes must be 0 or 12");
  }
  const uint32_t cells = shape.tokens;
  if (!layout.pos.empty() && layout.pos.size() != cells) {
    return Status::InvalidArgument("llama state: " + std::to_string(layout.pos.size()) + " positions for " +
                                   std::to_string(cells) + " tokens");
  }
  if (!layout.ext.empty() && layout.ext.size() != size_t{cells} * layout.cell_ext_bytes) {
    return Status::InvalidArgument("llama state: ext bytes do not match the token count");
  }
  const uint64_t width64 = shape.channels();
  if (width64 > std::numeric_limits<uint32_t>::max()) return Status::InvalidArgument("llama state: row too wide");
  const uint32_t width = static_cast<uint32_t>(width64);
  const size_t kb = ElemBytes(layout.k_type), vb = ElemBytes(layout.v_type);

  std::vector<uint8_t> out;
  out.reserve(64 + size_t{cells} * (12 + layout.cell_ext_bytes) + shape.values() / 2 * (kb + vb) +
              size_t{shape.layers} * 24);
  ByteWriter w(&out);
  w.U32(kLlamaSeqStateMagic);
  w.U32(static_cast<uint32_t>(layout.seq_id));
  w.U32(layout.n_stream);
  for (uint32_t s = 0; s < layout.n_stream; ++s) {
    if (s != layout.stream) {
      w.U32(0);
      continue;
    }
    w.U32(cells);
    for (uint32_t t = 0; t < cells; ++t) {
      w.U32(static_cast<uint32_t>(layout.pos.empty() ? static_cast<int32_t>(t) : layout.pos[t]));
      w.U32(1);
      if (layout.cell_ext_bytes) {
        if (layout.ext.empty()) {
          for (uint32_t b = 0; b < layout.cell_ext_bytes; ++b) w.U8(0);
        } else {
          w.Bytes(std::span<const uint8_t>(layout.ext).subspan(size_t{t} * layout.cell_ext_bytes,
                                                                layout.cell_ext_bytes));
        }
      }
      w.U32(static_cast<uint32_t>(layout.seq_id));
    }
    w.U32(layout.v_trans ? 1 : 0);
    w.U32(shape.layers);
    std::vector<float> row(width);
    const bool raw_k = RawRows(kv, layout.k_type), raw_v = RawRows(kv, layout.v_type);
    for (uint32_t l = 0; l < shape.layers; ++l) {
      w.U32(static_cast<uint32_t>(layout.k_type));
      w.U64(uint64_t{width} * kb);
      const size_t at = out.size();
      out.resize(at + size_t{cells} * width * kb);
      for (uint32_t t = 0; t < cells; ++t) {
        uint8_t* p = out.data() + at + size_t{t} * width * kb;
        if (raw_k) {
          std::memcpy(p, kv.Pointer(l, KV::kKey, t, 0, 0), size_t{width} * kb);
          continue;
        }
        kv.ReadRow(l, KV::kKey, t, row.data());
        for (uint32_t c = 0; c < width; ++c) StoreValue(p + c * kb, layout.k_type, row[c]);
      }
    }
    for (uint32_t l = 0; l < shape.layers; ++l) {
      w.U32(static_cast<uint32_t>(layout.v_type));
      if (layout.v_trans) {
        w.U32(static_cast<uint32_t>(vb));
        w.U32(width);
      } else {
        w.U64(uint64_t{width} * vb);
      }
      const size_t at = out.size();
      out.resize(at + size_t{cells} * width * vb);
      for (uint32_t t = 0; t < cells; ++t) {
        if (raw_v) {
          const auto* src = static_cast<const uint8_t*>(kv.Pointer(l, KV::kValue, t, 0, 0));
          if (!layout.v_trans) {
            std::memcpy(out.data() + at + size_t{t} * width * vb, src, size_t{width} * vb);
          } else {
            for (uint32_t c = 0; c < width; ++c)
              std::memcpy(out.data() + at + (size_t{c} * cells + t) * vb, src + c * vb, vb);
          }
          continue;
        }
        kv.ReadRow(l, KV::kValue, t, row.data());
        for (uint32_t c = 0; c < width; ++c) {
          const size_t idx = layout.v_trans ? size_t{c} * cells + t : size_t{t} * width + c;
          StoreValue(out.data() + at + idx * vb, layout.v_type, row[c]);
        }
      }
    }
  }
  return out;
}

}  // namespace cachegen::engine
