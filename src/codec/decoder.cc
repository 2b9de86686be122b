// Decoder and the free frame functions. Every byte is untrusted: frames are
// parsed and checked against what the container index promises before any
// section is decoded, and each section's checksum is verified before its
// codec sees it.
#include <string>

#include "cachegen/codec.h"
#include "codec/codec.h"
#include "common/parallel.h"
#include "format/container.h"
#include "format/frame.h"

namespace cachegen {
namespace {

// Decodes section (layer, kv) of a parsed frame into `out` (frame's shape).
Status DecodeSectionInto(const Codec& codec, const ParsedFrame& p, std::span<const uint8_t> frame,
                         const ProfileSet* profiles, uint32_t layer, KV kv, const KVView& out,
                         std::vector<float>& scratch) {
  CG_ASSIGN_OR_RETURN(std::span<const uint8_t> payload, SectionPayload(p, frame, layer, kv));
  const FrameHeader& h = p.header;
  SectionContext ctx;
  ctx.shape = h.shape;
  ctx.layer = layer;
  ctx.kv = kv;
  ctx.level = h.level;
  ctx.token_start = h.token_start;
  ctx.context_tokens = h.context_tokens;
  ctx.params = h.params;
  ctx.profiles = profiles;
  return codec.DecodeSectionToView(ctx, payload, out, scratch);
}

Status DecodeParsed(const ParsedFrame& p, std::span<const uint8_t> frame, const ProfileSet* profiles,
                    const KVView& out, uint32_t threads) {
  if (!(out.shape() == p.header.shape))
    return Status::InvalidArgument("output shape " + out.shape().ToString() + " does not match frame shape " +
                                   p.header.shape.ToString());
  CG_ASSIGN_OR_RETURN(const Codec* codec, FrameCodec(static_cast<uint8_t>(p.header.codec), p.header.params));
  const uint64_t sections = p.sections.size();
  if (threads <= 1) {
    std::vector<float> scratch;
    for (uint64_t i = 0; i < sections; ++i)
      CG_RETURN_IF_ERROR(DecodeSectionInto(*codec, p, frame, profiles, static_cast<uint32_t>(i / 2),
                                           static_cast<KV>(i % 2), out, scratch));
    return Status::Ok();
  }
  return ParallelFor(sections, threads, [&](uint64_t i) {
    std::vector<float> scratch;
    return DecodeSectionInto(*codec, p, frame, profiles, static_cast<uint32_t>(i / 2), static_cast<KV>(i % 2), out, scratch);
  });
}

}  // namespace

Status Codec::DecodeSectionToView(const SectionContext& ctx, std::span<const uint8_t> payload, const KVView& out,
                                  std::vector<float>& scratch) const {
  const uint64_t row = ctx.shape.channels();
  // DecodeSection writes every value, so a reused buffer needs no clearing.
  scratch.resize(uint64_t{ctx.shape.tokens} * row);
  CG_RETURN_IF_ERROR(DecodeSection(ctx, payload, scratch));
  for (uint32_t t = 0; t < ctx.shape.tokens; ++t) out.WriteRow(ctx.layer, ctx.kv, t, &scratch[t * row]);
  return Status::Ok();
}

namespace {

// The facts of a parsed frame (InspectFrame, VerifyFrame).
Result<FrameInfo> FrameFacts(const ParsedFrame& p, std::span<const uint8_t> frame) {
  CG_ASSIGN_OR_RETURN(const Codec* codec, FrameCodec(static_cast<uint8_t>(p.header.codec), p.header.params));
  FrameInfo info;
  info.codec = std::string(codec->name());
  info.format_version = p.header.chunk_key ? kFormatVersion : kUnboundFormatVersion;
  info.chunk_key = p.header.chunk_key;
  info.dtype = p.header.dtype;
  info.shape = p.header.shape;
  info.level = p.header.level;
  info.token_start = p.header.token_start;
  info.context_tokens = p.header.context_tokens;
  info.bytes = frame.size();
  info.header_bytes = p.header_bytes;
  for (size_t i = 0; i < p.sections.size(); ++i) {
    info.side_bytes += p.sections[i].side_bytes;
    (i % 2 == 0 ? info.layer_bytes_k : info.layer_bytes_v).push_back(p.sections[i].size);
  }
  return info;
}

}  // namespace

Result<FrameInfo> InspectFrame(std::span<const uint8_t> frame) {
  CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
  return FrameFacts(p, frame);
}

Result<FrameInfo> VerifyFrame(std::span<const uint8_t> frame) {
  CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
  CG_ASSIGN_OR_RETURN(FrameInfo info, FrameFacts(p, frame));
  for (uint32_t layer = 0; layer < p.header.shape.layers; ++layer)
    for (KV kv : {KV::kKey, KV::kValue}) CG_RETURN_IF_ERROR(SectionPayload(p, frame, layer, kv).status());
  return info;
}

Result<std::vector<uint8_t>> BindFrameToChunk(std::span<const uint8_t> frame, const ChunkKey& key) {
  return BindFrame(frame, key);
}

Status DecodeFrame(std::span<const uint8_t> frame, const KVView& out, uint32_t threads,
                   const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
  return DecodeParsed(p, frame, profiles, out, ResolveThreads(threads));
}

Status DecodeFrameLayer(std::span<const uint8_t> frame, uint32_t layer, const KVView& out,
                        const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
  if (!(out.shape() == p.header.shape))
    return Status::InvalidArgument("output shape " + out.shape().ToString() + " does not match frame shape " +
                                   p.header.shape.ToString());
  if (layer >= p.header.shape.layers)
    return Status::InvalidArgument("layer " + std::to_string(layer) + " out of range (frame has " +
                                   std::to_string(p.header.shape.layers) + ")");
  CG_ASSIGN_OR_RETURN(const Codec* codec, FrameCodec(static_cast<uint8_t>(p.header.codec), p.header.params));
  std::vector<float> scratch;
  CG_RETURN_IF_ERROR(DecodeSectionInto(*codec, p, frame, profiles, layer, KV::kKey, out, scratch));
  return DecodeSectionInto(*codec, p, frame, profiles, layer, KV::kValue, out, scratch);
}

Result<Decoder> Decoder::Open(std::span<const uint8_t> container, const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(ContainerInfo info, ParseContainer(container));
  Decoder d;
  d.bytes_ = container;
  d.profiles_ = profiles;
  d.info_ = std::move(info);
  return d;
}

Result<std::span<const uint8_t>> Decoder::Frame(uint32_t chunk, uint32_t level) const {
  if (chunk >= info_.chunks.size())
    return Status::InvalidArgument("chunk " + std::to_string(chunk) + " out of range");
  if (level >= info_.levels) return Status::InvalidArgument("level " + std::to_string(level) + " out of range");
  const ChunkEntry& e = info_.chunks[chunk];
  return bytes_.subspan(e.frame_offset[level], e.frame_size[level]);  // bounds checked by ParseContainer
}

Status Decoder::Decode(const KVView& out, uint32_t level, uint32_t threads) const {
  if (!(out.shape() == info_.shape))
    return Status::InvalidArgument("output shape " + out.shape().ToString() + " does not match container shape " +
                                   info_.shape.ToString());
  if (level >= info_.levels)
    return Status::InvalidArgument("level " + std::to_string(level) + " out of range (container has " +
                                   std::to_string(info_.levels) + ")");
  const uint32_t workers = ResolveThreads(threads);
  const uint64_t chunks = info_.chunks.size();
  // Parallel over chunks; with fewer chunks than workers, each chunk's
  // sections share the rest (a lone chunk's sections take them all).
  const uint32_t inner = chunks >= workers ? 1 : static_cast<uint32_t>((workers + chunks - 1) / chunks);
  return ParallelFor(chunks, workers, [&](uint64_t c) -> Status {
    const ChunkEntry& e = info_.chunks[c];
    CG_ASSIGN_OR_RETURN(std::span<const uint8_t> frame, Frame(static_cast<uint32_t>(c), level));
    CG_ASSIGN_OR_RETURN(ParsedFrame p, ParseFrame(frame));
    CG_RETURN_IF_ERROR(CheckFrameAgainstIndex(info_, static_cast<uint32_t>(c), level, p.header));
    return DecodeParsed(p, frame, profiles_, out.Tokens(e.token_start - info_.token_start, e.tokens), inner);
  });
}

uint64_t DecodeOutputLimit(uint64_t input_bytes) {
  constexpr uint64_t kRatio = 1024, kSlack = 64ull << 20;
  return input_bytes > (UINT64_MAX - kSlack) / kRatio ? UINT64_MAX : kRatio * input_bytes + kSlack;
}

Result<KVTensor> Decoder::Decode(DType dtype, uint32_t level, uint32_t threads, uint64_t max_output_bytes) const {
  const uint64_t limit = max_output_bytes ? max_output_bytes : DecodeOutputLimit(bytes_.size());
  const uint64_t want = info_.shape.values() * DTypeSize(dtype);
  if (want > limit)
    return Status::InvalidArgument("container of " + std::to_string(bytes_.size()) + " bytes claims " +
                                   std::to_string(want) + " bytes of KV, over the decode limit of " +
                                   std::to_string(limit) + " (docs/FORMAT.md, \"Decode bound\")");
  // Not zero-filled first: the chunks tile the container's tokens
  // (ParseContainer) and every section decode writes all rows of its layer
  // and K|V (decoder_fill_test checks each codec). On an error the tensor is
  // dropped unread.
  KVTensor t = KVTensor::Unfilled(info_.shape, dtype);
  CG_RETURN_IF_ERROR(Decode(t.view(), level, threads));
  return t;
}

}  // namespace cachegen
