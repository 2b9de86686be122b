#include "engine/llama_slot_file.h"

#include "common/bytes.h"
#include "common/checksum.h"

namespace cachegen::engine {
namespace {

// u32 magic + i32 seq_id at the start of a llama_state_seq_get_data blob.
constexpr size_t kBlobHeadBytes = 8;

uint32_t PickKVHeads(uint32_t width) {
  for (uint32_t d : {128u, 64u})
    if (width % d == 0) return width / d;
  return 1;
}

void WriteLayout(ByteWriter& w, const LlamaSeqLayout& l) {
  w.U32(static_cast<uint32_t>(l.seq_id));
  w.U32(l.n_stream);
  w.U32(l.stream);
  w.U32(l.cell_ext_bytes);
  w.U8(l.v_trans ? 1 : 0);
  w.U32(static_cast<uint32_t>(l.k_type));
  w.U32(static_cast<uint32_t>(l.v_type));
  w.U32(static_cast<uint32_t>(l.pos.size()));
  for (int32_t p : l.pos) w.U32(static_cast<uint32_t>(p));
  w.Bytes(l.ext);
}

Result<LlamaSeqLayout> ReadLayout(ByteReader& r) {
  LlamaSeqLayout l;
  l.seq_id = static_cast<int32_t>(r.U32());
  l.n_stream = r.U32();
  l.stream = r.U32();
  l.cell_ext_bytes = r.U32();
  const uint8_t v_trans = r.U8();
  l.k_type = static_cast<int32_t>(r.U32());
  l.v_type = static_cast<int32_t>(r.U32());
  const uint32_t cells = r.U32();
  if (!r.ok() || v_trans > 1 || l.stream >= l.n_stream || (l.cell_ext_bytes != 0 && l.cell_ext_bytes != kLlamaCellExtBytes))
    return Status::Corrupt("cgslot: bad layout header");
  l.v_trans = v_trans == 1;
  if (cells > r.remaining() / 4) return Status::Corrupt("cgslot: cell count exceeds the file");
  l.pos.resize(cells);
  for (int32_t& p : l.pos) p = static_cast<int32_t>(r.U32());
  const uint64_t ext = uint64_t{cells} * l.cell_ext_bytes;
  if (ext > r.remaining()) return Status::Corrupt("cgslot: cell data exceeds the file");
  std::span<const uint8_t> ext_bytes = r.Bytes(ext);
  if (!r.ok()) return Status::Corrupt("cgslot: truncated layout");
  l.ext.assign(ext_bytes.begin(), ext_bytes.end());
  return l;
}

}  // namespace

Result<LlamaSlotFile> ParseLlamaSlotFile(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  const uint32_t magic = r.U32(), version = r.U32(), n = r.U32();
  if (!r.ok()) return Status::Corrupt("slot file: shorter than its header");
  if (magic != kLlamaSlotMagic) return Status::Corrupt("not a llama.cpp slot file (magic)");
  if (version != kLlamaSlotVersion)
    return Status::Unsupported("llama.cpp slot file version " + std::to_string(version) + " (supported: 3)");
  if (n > r.remaining() / 4) return Status::Corrupt("slot file: token count exceeds the file");
  LlamaSlotFile f;
  f.tokens.resize(n);
  for (int32_t& t : f.tokens) t = static_cast<int32_t>(r.U32());
  f.state = bytes.subspan(r.position());
  return f;
}

std::vector<uint8_t> WriteLlamaSlotFile(std::span<const int32_t> tokens, std::span<const uint8_t> state) {
  std::vector<uint8_t> out;
  out.reserve(12 + 4 * tokens.size() + state.size());
  ByteWriter w(&out);
  w.U32(kLlamaSlotMagic);
  w.U32(kLlamaSlotVersion);
  w.U32(static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) w.U32(static_cast<uint32_t>(t));
  w.Bytes(state);
  return out;
}

Result<std::vector<uint8_t>> CompressSlotFile(std::span<const uint8_t> slot_file, const CodecConfig& config,
                                              uint32_t kv_heads, EncodeStats* stats,
                                              const GgmlQuantizer* quantizer) {
  Result<LlamaSlotFile> slot = ParseLlamaSlotFile(slot_file);
  if (!slot.ok()) return slot.status();
  // A slot file's state lacks the (magic, seq_id) head that the in-memory
  // blob API writes; restore it so one parser serves both.
  std::vector<uint8_t> blob;
  blob.reserve(kBlobHeadBytes + slot->state.size());
  ByteWriter bw(&blob);
  bw.U32(kLlamaSeqStateMagic);
  bw.U32(0);
  bw.Bytes(slot->state);
  Result<LlamaSeqState> state = ParseLlamaSeqState(blob);
  if (!state.ok()) return state.status();
  Result<LlamaSeqLayout> layout = LayoutOf(*state);
  if (!layout.ok()) return layout.status();
  if (state->sections.empty() || state->sections[0].streams.empty())
    return Status::InvalidArgument("slot file holds no KV cells");
  const uint32_t width = state->sections[0].streams[0].k_width[0];
  Result<KVTensor> kv = ExtractLlamaKV(blob, *state, kv_heads ? kv_heads : PickKVHeads(width), quantizer);
  if (!kv.ok()) return kv.status();
  // The codec's RoPE handling puts token t at position t: other cell
  // positions (a shifted or pruned cache) are coded as they are.
  CodecConfig cfg = config;
  for (size_t t = 0; t < layout->pos.size(); ++t)
    if (layout->pos[t] != static_cast<int32_t>(t)) cfg.rope = RopeConfig{};
  Result<Encoder> enc = Encoder::Create(cfg);
  if (!enc.ok()) return enc.status();
  Result<std::vector<uint8_t>> container = enc->Encode(kv->view(), stats);
  if (!container.ok()) return container.status();

  std::vector<uint8_t> out;
  out.reserve(64 + container->size());
  ByteWriter w(&out);
  w.U32(kCgSlotMagic);
  w.U32(kCgSlotVersion);
  w.U32(static_cast<uint32_t>(slot->tokens.size()));
  for (int32_t t : slot->tokens) w.U32(static_cast<uint32_t>(t));
  WriteLayout(w, *layout);
  w.U64(container->size());
  w.Bytes(*container);
  w.U64(Checksum64(std::span<const uint8_t>(out.data(), out.size() - container->size())));
  return out;
}

Result<std::vector<uint8_t>> RestoreSlotFile(std::span<const uint8_t> cgslot, uint32_t level, uint32_t threads,
                                             const ProfileSet* profiles, const GgmlQuantizer* quantizer) {
  ByteReader r(cgslot);
  const uint32_t magic = r.U32(), version = r.U32(), n = r.U32();
  if (!r.ok() || magic != kCgSlotMagic) return Status::Corrupt("not a .cgslot file (magic)");
  if (version != kCgSlotVersion) return Status::Unsupported("cgslot version " + std::to_string(version));
  if (n > r.remaining() / 4) return Status::Corrupt("cgslot: token count exceeds the file");
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(r.U32());
  Result<LlamaSeqLayout> layout = ReadLayout(r);
  if (!layout.ok()) return layout.status();
  const uint64_t size = r.U64();
  if (!r.ok() || size > r.remaining() || r.remaining() - size != 8) return Status::Corrupt("cgslot: bad container size");
  const size_t container_at = r.position();
  std::span<const uint8_t> container = cgslot.subspan(container_at, size);
  ByteReader tail(cgslot.subspan(container_at + size));
  const uint64_t sum = tail.U64();
  // The checksum covers the header and layout; the container checks its own bytes.
  if (sum != Checksum64(cgslot.first(container_at))) return Status::Corrupt("cgslot: header checksum mismatch");
  Result<Decoder> dec = Decoder::Open(container, profiles);
  if (!dec.ok()) return dec.status();
  if (dec->info().shape.tokens != layout->pos.size())
    return Status::Corrupt("cgslot: container tokens differ from the cell count");
  Result<KVTensor> kv = dec->Decode(dec->info().dtype, level, threads);
  if (!kv.ok()) return kv.status();
  Result<std::vector<uint8_t>> state = WriteLlamaSeqState(*layout, kv->view(), quantizer);
  if (!state.ok()) return state.status();
  return WriteLlamaSlotFile(tokens, std::span<const uint8_t>(*state).subspan(kBlobHeadBytes));
}

}  // namespace cachegen::engine
