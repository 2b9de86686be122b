#include "engine/llama_state.h"

#include <cstring>
#include <limits>

#include "common/bytes.h"
#include "common/half.h"

namespace cachegen::engine {
namespace {

constexpr GgmlCacheType kCacheTypes[] = {
    {kGgmlF32, "f32", 1, 4},       {kGgmlF16, "f16", 1, 2},       {kGgmlBF16, "bf16", 1, 2},
    {kGgmlQ8_0, "q8_0", 32, 34},   {kGgmlQ4_0, "q4_0", 32, 18},   {kGgmlQ4_1, "q4_1", 32, 20},
    {kGgmlQ5_0, "q5_0", 32, 22},   {kGgmlQ5_1, "q5_1", 32, 24},   {kGgmlIQ4_NL, "iq4_nl", 32, 18},
};

// Bytes of `width` values of type t (width a multiple of its block).
uint64_t RowBytes(const GgmlCacheType& t, uint64_t width) { return width / t.block * t.block_bytes; }

Result<const GgmlCacheType*> TypeOf(int32_t type, const char* what, uint32_t layer) {
  if (const GgmlCacheType* t = FindGgmlCacheType(type)) return t;
  const std::string where = std::string(what) + " of layer " + std::to_string(layer);
  if (type < 0 || type >= 64) return Status::Corrupt("llama state: " + where + " has unknown ggml type " + std::to_string(type));
  return Status::Unsupported("llama state: " + where + " has ggml type " + std::to_string(type) +
                             ", which is not a KV cache type");
}

// Checks a K or V row header (type and row bytes) of layer l against the
// cells still to come; sets the row's width in values.
Status CheckRow(const char* what, int32_t type, uint64_t row, uint32_t l, uint32_t cells, size_t remaining,
                uint32_t* width) {
  CG_ASSIGN_OR_RETURN(const GgmlCacheType* t, TypeOf(type, what, l));
  if (row == 0 || row % t->block_bytes != 0 || row / t->block_bytes * t->block > std::numeric_limits<uint32_t>::max()) {
    return Status::Corrupt("llama state: " + std::string(what) + " row of layer " + std::to_string(l) + " has " +
                           std::to_string(row) + " bytes");
  }
  if (row > remaining / cells) {
    return Status::Corrupt("llama state: " + std::string(what) + " data of layer " + std::to_string(l) +
                           " out of bounds");
  }
  *width = static_cast<uint32_t>(row / t->block_bytes * t->block);
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
      CG_ASSIGN_OR_RETURN(const GgmlCacheType* t, TypeOf(type, "V", l));
      if (t->quantized()) {
        return Status::Unsupported("llama state: transposed V of quantized type " + GgmlTypeName(type) +
                                   " (llama.cpp needs flash attention for a quantized V cache)");
      }
      if (elem != t->block_bytes) {
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

// Reads and writes rows (one cell's `width` values) of one K or V tensor
// in the blob: contiguous rows, or V transposed (value c of cell t at
// c * cells + t). Quantized rows go through the quantizer.
class RowCodec {
 public:
  RowCodec(const GgmlCacheType& type, const GgmlQuantizer* q, uint32_t width, uint32_t cells, bool transposed)
      : type_(type), q_(q), width_(width), cells_(cells), transposed_(transposed) {}

  uint64_t bytes() const { return RowBytes(type_, width_) * cells_; }

  void Load(const uint8_t* data, uint32_t t, float* row) const {
    if (transposed_) {
      for (uint32_t c = 0; c < width_; ++c) row[c] = LoadValue(data + (size_t{c} * cells_ + t) * type_.block_bytes, type_.id);
      return;
    }
    const uint8_t* p = data + t * RowBytes(type_, width_);
    if (type_.quantized()) {
      q_->Dequantize(type_.id, p, row, width_);
      return;
    }
    for (uint32_t c = 0; c < width_; ++c) row[c] = LoadValue(p + size_t{c} * type_.block_bytes, type_.id);
  }

  void Store(uint8_t* data, uint32_t t, const float* row) const {
    if (transposed_) {
      for (uint32_t c = 0; c < width_; ++c) StoreValue(data + (size_t{c} * cells_ + t) * type_.block_bytes, type_.id, row[c]);
      return;
    }
    uint8_t* p = data + t * RowBytes(type_, width_);
    if (type_.quantized()) {
      q_->Quantize(type_.id, row, p, width_);
      return;
    }
    for (uint32_t c = 0; c < width_; ++c) StoreValue(p + size_t{c} * type_.block_bytes, type_.id, row[c]);
  }

  // Whether row t of `v` (layer, part) holds exactly the blob's bytes of
  // cell t, so that it is copied as it is.
  bool Raw(const KVView& v) const {
    const Result<DType> stored = DTypeOfGgml(type_.id);  // not ok for quantized types
    const KVShape& s = v.shape();
    return stored.ok() && *stored == v.dtype() && v.strides().dim == 1 &&
           (s.kv_heads == 1 || v.strides().head == int64_t{s.head_dim});
  }

  // Copies between the blob and a raw row of `v` (see Raw).
  void CopyOut(const uint8_t* data, uint32_t t, uint8_t* dst) const {
    const size_t eb = type_.block_bytes;
    if (!transposed_) {
      std::memcpy(dst, data + size_t{t} * width_ * eb, size_t{width_} * eb);
      return;
    }
    for (uint32_t c = 0; c < width_; ++c) std::memcpy(dst + c * eb, data + (size_t{c} * cells_ + t) * eb, eb);
  }
  void CopyIn(uint8_t* data, uint32_t t, const uint8_t* src) const {
    const size_t eb = type_.block_bytes;
    if (!transposed_) {
      std::memcpy(data + size_t{t} * width_ * eb, src, size_t{width_} * eb);
      return;
    }
    for (uint32_t c = 0; c < width_; ++c) std::memcpy(data + (size_t{c} * cells_ + t) * eb, src + c * eb, eb);
  }

 private:
  const GgmlCacheType& type_;
  const GgmlQuantizer* q_;
  uint32_t width_, cells_;
  bool transposed_;
};

// Type `type` checked for a layout that writes it, or reads it back.
Result<const GgmlCacheType*> UsableType(int32_t type, bool transposed, const GgmlQuantizer* q) {
  const GgmlCacheType* t = FindGgmlCacheType(type);
  if (!t) return Status::Unsupported("llama state: " + GgmlTypeName(type) + " is not a KV cache type");
  if (t->quantized() && !q) {
    return Status::Unsupported("llama state: cache type " + std::string(t->name) +
                               " is quantized and needs ggml's quantizer (a build with llama.cpp)");
  }
  if (t->quantized() && transposed) {
    return Status::Unsupported(std::string("llama state: a transposed V cannot be of quantized type ") + t->name);
  }
  return t;
}

}  // namespace

const GgmlCacheType* FindGgmlCacheType(int32_t type) {
  for (const GgmlCacheType& t : kCacheTypes) {
    if (t.id == type) return &t;
  }
  return nullptr;
}

Result<int32_t> GgmlCacheTypeByName(const std::string& name) {
  for (const GgmlCacheType& t : kCacheTypes) {
    if (name == t.name) return t.id;
  }
  return Status::InvalidArgument("unknown llama.cpp cache type '" + name + "' (" + GgmlCacheTypeNames() + ")");
}

std::string GgmlCacheTypeNames() {
  std::string names;
  for (const GgmlCacheType& t : kCacheTypes) names += std::string(names.empty() ? "" : ", ") + t.name;
  return names;
}

std::string GgmlTypeName(int32_t type) {
  if (const GgmlCacheType* t = FindGgmlCacheType(type)) return t->name;
  return "type " + std::to_string(type);
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

Result<KVTensor> ExtractLlamaKV(std::span<const uint8_t> blob, const LlamaSeqState& state, uint32_t kv_heads,
                                const GgmlQuantizer* quantizer) {
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
  std::vector<RowCodec> k_rows, v_rows;
  bool same = true;  // one unquantized type for all of K and V
  for (uint32_t l = 0; l < s.layers; ++l) {
    if (s.k_width[l] != width || s.v_width[l] != width) {
      return Status::Unsupported("llama state: K/V widths differ across layers or between K and V (layer " +
                                 std::to_string(l) + ")");
    }
    CG_ASSIGN_OR_RETURN(const GgmlCacheType* kt, UsableType(s.k_type[l], false, quantizer));
    CG_ASSIGN_OR_RETURN(const GgmlCacheType* vt, UsableType(s.v_type[l], s.v_trans, quantizer));
    k_rows.emplace_back(*kt, quantizer, width, s.cells, false);
    v_rows.emplace_back(*vt, quantizer, width, s.cells, s.v_trans);
    same = same && !kt->quantized() && kt->id == s.k_type[0] && vt->id == s.k_type[0];
  }
  if (kv_heads == 0 || width % kv_heads != 0) {
    return Status::InvalidArgument("llama state: " + std::to_string(kv_heads) + " KV heads do not divide width " +
                                   std::to_string(width));
  }
  const DType dtype = same ? *DTypeOfGgml(s.k_type[0]) : DType::kF32;
  // The state may come from another blob: its offsets must lie inside this one.
  for (uint32_t l = 0; l < s.layers; ++l) {
    if (s.k_offset[l] > blob.size() || k_rows[l].bytes() > blob.size() - s.k_offset[l] ||
        s.v_offset[l] > blob.size() || v_rows[l].bytes() > blob.size() - s.v_offset[l]) {
      return Status::InvalidArgument("llama state: the parsed state does not belong to this blob");
    }
  }

  KVShape shape{s.layers, kv_heads, width / kv_heads, s.cells};
  CG_RETURN_IF_ERROR(shape.Validate());
  KVTensor out(shape, dtype);
  KVView view = out.view();
  std::vector<float> row(width);
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (KV part : {KV::kKey, KV::kValue}) {
      const RowCodec& rows = part == KV::kKey ? k_rows[l] : v_rows[l];
      const uint8_t* data = blob.data() + (part == KV::kKey ? s.k_offset[l] : s.v_offset[l]);
      const bool raw = rows.Raw(view);
      for (uint32_t t = 0; t < s.cells; ++t) {
        if (raw) {
          rows.CopyOut(data, t, static_cast<uint8_t*>(view.Pointer(l, part, t, 0, 0)));
          continue;
        }
        rows.Load(data, t, row.data());
        view.WriteRow(l, part, t, row.data());
      }
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

Result<std::vector<uint8_t>> WriteLlamaSeqState(const LlamaSeqLayout& layout, const KVView& kv,
                                                const GgmlQuantizer* quantizer) {
  const KVShape& shape = kv.shape();
  CG_RETURN_IF_ERROR(shape.Validate());
  CG_ASSIGN_OR_RETURN(const GgmlCacheType* kt, UsableType(layout.k_type, false, quantizer));
  CG_ASSIGN_OR_RETURN(const GgmlCacheType* vt, UsableType(layout.v_type, layout.v_trans, quantizer));
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
  if (width % kt->block != 0 || width % vt->block != 0) {
    return Status::InvalidArgument("llama state: rows of " + std::to_string(width) + " values are not whole blocks of " +
                                   kt->name + "/" + vt->name);
  }
  const RowCodec k_rows(*kt, quantizer, width, cells, false), v_rows(*vt, quantizer, width, cells, layout.v_trans);

  std::vector<uint8_t> out;
  out.reserve(64 + size_t{cells} * (12 + layout.cell_ext_bytes) + (k_rows.bytes() + v_rows.bytes()) * shape.layers +
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
    // Appends one layer's K or V data after its header.
    auto write_part = [&](uint32_t l, KV part, const RowCodec& rows) {
      const size_t at = out.size();
      out.resize(at + rows.bytes());
      const bool raw = rows.Raw(kv);
      for (uint32_t t = 0; t < cells; ++t) {
        if (raw) {
          rows.CopyIn(out.data() + at, t, static_cast<const uint8_t*>(kv.Pointer(l, part, t, 0, 0)));
          continue;
        }
        kv.ReadRow(l, part, t, row.data());
        rows.Store(out.data() + at, t, row.data());
      }
    };
    for (uint32_t l = 0; l < shape.layers; ++l) {
      w.U32(static_cast<uint32_t>(layout.k_type));
      w.U64(RowBytes(*kt, width));
      write_part(l, KV::kKey, k_rows);
    }
    for (uint32_t l = 0; l < shape.layers; ++l) {
      w.U32(static_cast<uint32_t>(layout.v_type));
      if (layout.v_trans) {
        w.U32(vt->block_bytes);
        w.U32(width);
      } else {
        w.U64(RowBytes(*vt, width));
      }
      write_part(l, KV::kValue, v_rows);
    }
  }
  return out;
}

}  // namespace cachegen::engine
