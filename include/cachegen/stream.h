// Chunk keys of a context and storing a context's chunks in a ChunkStore.
//
// A context (token ids + their KV) is split into chunks of T tokens (the last
// chunk may be shorter). Chunk i's key is a hash chain over XXH3-128:
//
//   key_0' = root = H("cachegen-chunk-root-v1", model fingerprint, profile, T)
//   key_i  = H(key_{i-1}, token ids of chunk i)    (key_{-1} = root)
//
// so two contexts that share a prefix of whole chunks share those chunks'
// keys, and a chunk's key names its whole prefix (not just its own tokens).
// The root binds the chain to the model (whose KV the chunks hold) and to the
// codec profile (how they were encoded), so differently encoded or different
// models' caches never collide. Byte layouts are specified in docs/SERVICE.md.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen {

using TokenId = int32_t;

// Default chunk size in tokens (see docs/SERVICE.md for the measurement).
constexpr uint32_t kDefaultChunkTokens = 256;
// Quality levels a chunk may have (the frame format allows 0..7).
constexpr uint32_t kMaxChunkLevels = 8;

// The root of a context's key chain. chunk_tokens must be > 0.
ChunkKey ChainRoot(std::string_view model_fingerprint, std::string_view codec_profile, uint32_t chunk_tokens);
// The codec profile (ChainRoot) of chunks coded with model profile `id`
// (cachegen/profile.h): `codec_profile` with the id appended, so that chunks
// coded with another model profile, or none, are other chunks.
std::string WithModelProfile(std::string_view codec_profile, uint64_t id);
// Where a store keeps a model's shared profile (.cgprof bytes at level 0), so
// that every server of the model codes with one profile: H("cachegen-model-
// profile-v1", fingerprint, settings), settings naming how it was learned.
ChunkKey ModelProfileKey(std::string_view model_fingerprint, std::string_view settings);
// key_i from key_{i-1} and chunk i's token ids.
ChunkKey NextChunkKey(const ChunkKey& previous, std::span<const TokenId> tokens);
// The keys of every chunk of `tokens` (ceil(size / chunk_tokens) keys; the last
// chunk holds the remainder). chunk_tokens must be > 0.
std::vector<ChunkKey> ChunkKeys(const ChunkKey& root, std::span<const TokenId> tokens, uint32_t chunk_tokens);

// One chunk of a lookup answer: per level the stored frame size, 0 = absent.
struct CachedChunk {
  ChunkKey key;
  std::vector<uint64_t> level_bytes;  // size kMaxChunkLevels (or the levels asked for)
  bool any() const;
};

// The longest prefix of `keys` whose chunks each have at least one level in
// `store`, with every chunk's size per level (levels 0..levels-1). A store
// that cannot answer (unreachable, failing: anything but kNotFound) ends the
// prefix there: a lookup answers what is usable now. Its first such error
// goes to *error when given (else *error is ok), so that a caller can tell
// an unreachable store from an empty one.
std::vector<CachedChunk> LookupPrefix(ChunkStore& store, std::span<const ChunkKey> keys,
                                      uint32_t levels = kMaxChunkLevels, Status* error = nullptr);

// Parses token ids written as decimal integers separated by whitespace and/or
// commas (a tokens file). InvalidArgument names the first bad entry.
Result<std::vector<TokenId>> ParseTokenIds(std::string_view text);

// VerifyFrame, and the frame is bound to `key` (BindFrameToChunk) at
// `level`: what a store's record under (key, level) must hold. kCorrupt names
// the first mismatch.
Result<FrameInfo> FrameIsStoredAs(std::span<const uint8_t> frame, const ChunkKey& key, uint32_t level);

// FrameIsStoredAs, and the frame proves it is the chunk it was fetched as:
// holding tokens [token_start, token_start + tokens). kCorrupt names the first mismatch; a reader counts
// such a frame as a miss (StreamClient does, and tries another level).
Result<FrameInfo> FrameIsChunk(std::span<const uint8_t> frame, const ChunkKey& key, uint32_t level,
                               uint32_t token_start, uint32_t tokens);

struct PutStats {
  uint32_t chunks = 0;          // chunks of the context
  uint32_t chunks_stored = 0;   // chunks encoded and written now
  uint32_t chunks_skipped = 0;  // already present at every level (an earlier turn)
  uint64_t frames = 0;
  uint64_t bytes = 0;  // frame bytes written
  // Of the frames' sections, those coded with their own statistics instead of
  // the encoder's model profile (FrameStats::sections_unlike_profile).
  uint64_t sections_unlike_profile = 0;
};

// Stores a context's chunks at every level of `encoder`'s config:
// kv.shape().tokens must equal tokens.size(); chunks are encoder.config().
// chunk_tokens long (which must equal the chain's chunk size, > 0). A chunk
// already present at every level is skipped without encoding, so appending to
// a context (multi-turn) stores only its new chunks (and the old partial tail,
// whose key changes once it is completed).
Result<PutStats> PutContext(ChunkStore& store, const ChunkKey& root, std::span<const TokenId> tokens,
                            const KVView& kv, const Encoder& encoder);

// Stores the frames of an encoded container (chunk i, level l → frame) under
// the chain of `tokens`; the container's chunking must match the token count.
// Every frame of the chunks to store is decoded once before any is stored: a
// frame that does not decode here (damaged, or coded with a model profile not
// in `profiles`) fails the put with the decoder's error, and nothing is stored.
Result<PutStats> PutContainer(ChunkStore& store, const ChunkKey& root, std::span<const TokenId> tokens,
                              std::span<const uint8_t> container, const ProfileSet* profiles = nullptr);

}  // namespace cachegen
