// Storing a context's chunks (include/cachegen/stream.h).
#include "cachegen/stream.h"

namespace cachegen {
namespace {

// True when the chunk is present at every one of `levels` levels.
bool HasAllLevels(ChunkStore& store, const ChunkKey& key, uint32_t levels) {
  for (uint32_t l = 0; l < levels; ++l)
    if (!store.Size(key, l).ok()) return false;
  return true;
}

}  // namespace

Result<PutStats> PutContext(ChunkStore& store, const ChunkKey& root, std::span<const TokenId> tokens,
                            const KVView& kv, const Encoder& encoder) {
  const uint32_t T = encoder.config().chunk_tokens;
  if (T == 0) return Status::InvalidArgument("put: chunk_tokens must be > 0");
  if (kv.shape().tokens != tokens.size())
    return Status::InvalidArgument("put: " + std::to_string(tokens.size()) + " token ids for a KV of " +
                                   std::to_string(kv.shape().tokens) + " tokens");
  const std::vector<ChunkKey> keys = ChunkKeys(root, tokens, T);
  PutStats stats;
  stats.chunks = static_cast<uint32_t>(keys.size());
  const uint32_t context = kv.shape().tokens;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    const uint32_t start = i * T, count = std::min(T, context - start);
    // A chunk counts as present when it has every level the config yields
    // (only the rate-controlled `cachegen` codec makes more than one).
    const CodecConfig& cfg = encoder.config();
    const uint32_t want = cfg.codec != "cachegen" ? 1
                          : cfg.level_bits.empty() ? std::max<uint32_t>(cfg.levels, 1)
                                                   : static_cast<uint32_t>(cfg.level_bits.size());
    if (HasAllLevels(store, keys[i], want)) {
      ++stats.chunks_skipped;
      continue;
    }
    std::vector<FrameStats> frame_stats;
    CG_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> frames,
                        encoder.EncodeChunk(kv.Tokens(start, count), start, context, &frame_stats));
    for (const FrameStats& fs : frame_stats) stats.sections_unlike_profile += fs.sections_unlike_profile;
    for (uint32_t l = 0; l < frames.size(); ++l) {
      CG_ASSIGN_OR_RETURN(frames[l], BindFrameToChunk(frames[l], keys[i]));
      CG_RETURN_IF_ERROR(store.Put(keys[i], l, frames[l]));
      ++stats.frames;
      stats.bytes += frames[l].size();
    }
    ++stats.chunks_stored;
  }
  return stats;
}

Result<PutStats> PutContainer(ChunkStore& store, const ChunkKey& root, std::span<const TokenId> tokens,
                              std::span<const uint8_t> container, const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(Decoder dec, Decoder::Open(container, profiles));
  const ContainerInfo& info = dec.info();
  if (info.shape.tokens != tokens.size())
    return Status::InvalidArgument("put: " + std::to_string(tokens.size()) + " token ids for a container of " +
                                   std::to_string(info.shape.tokens) + " tokens");
  if (info.chunk_tokens == 0 && info.chunks.size() != 1)
    return Status::InvalidArgument("put: container has no uniform chunk size");
  const uint32_t T = info.chunk_tokens == 0 ? info.shape.tokens : info.chunk_tokens;
  const std::vector<ChunkKey> keys = ChunkKeys(root, tokens, T);
  if (keys.size() != info.chunks.size())
    return Status::InvalidArgument("put: container chunking does not match " + std::to_string(T) + "-token chunks");
  PutStats stats;
  stats.chunks = static_cast<uint32_t>(keys.size());
  // First every chunk to store is decoded (a damaged container stores nothing), then stored.
  std::vector<uint32_t> to_store;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (HasAllLevels(store, keys[i], info.levels)) {
      ++stats.chunks_skipped;
      continue;
    }
    KVShape shape = info.shape;
    shape.tokens = info.chunks[i].tokens;
    KVTensor scratch(shape, DType::kF16);
    for (uint32_t l = 0; l < info.levels; ++l) {
      CG_ASSIGN_OR_RETURN(std::span<const uint8_t> frame, dec.Frame(i, l));
      if (Status st = DecodeFrame(frame, scratch.view(), 1, profiles); !st.ok())
        return Status::InvalidArgument("put: chunk " + std::to_string(i) + " level " + std::to_string(l) +
                                       " does not decode: " + st.message());
    }
    to_store.push_back(i);
  }
  for (uint32_t i : to_store) {
    for (uint32_t l = 0; l < info.levels; ++l) {
      CG_ASSIGN_OR_RETURN(std::span<const uint8_t> unbound, dec.Frame(i, l));
      CG_ASSIGN_OR_RETURN(const std::vector<uint8_t> frame, BindFrameToChunk(unbound, keys[i]));
      CG_RETURN_IF_ERROR(store.Put(keys[i], l, frame));
      ++stats.frames;
      stats.bytes += frame.size();
    }
    ++stats.chunks_stored;
  }
  return stats;
}

}  // namespace cachegen
