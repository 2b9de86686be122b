// Uses the installed public headers and libraries only: encodes a context,
// stores its chunks in an in-process store and streams them back.
#include <cmath>
#include <cstdio>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"

int main() {
  using namespace cachegen;
  const KVShape shape{.layers = 2, .kv_heads = 2, .head_dim = 64, .tokens = 128};
  KVTensor kv(shape, DType::kF32);
  auto* values = reinterpret_cast<float*>(kv.data());
  for (uint64_t i = 0; i < shape.values(); ++i) values[i] = std::sin(0.01f * static_cast<float>(i));
  CodecConfig config;
  config.chunk_tokens = 64;
  auto encoder = Encoder::Create(config);
  auto store = OpenStore("mem://");
  if (!encoder.ok() || !store.ok()) return std::fprintf(stderr, "create failed\n"), 1;
  std::vector<TokenId> tokens(shape.tokens);
  for (uint32_t t = 0; t < shape.tokens; ++t) tokens[t] = static_cast<TokenId>(t);
  const ChunkKey root = ChainRoot("consumer-model", "default", 64);
  auto put = PutContext(**store, root, tokens, kv.view(), *encoder);
  if (!put.ok()) return std::fprintf(stderr, "put: %s\n", put.status().ToString().c_str()), 1;
  StreamClient client(store->get());
  StreamOptions options;
  options.deadline_ms = 60000;
  uint32_t delivered = 0;
  auto fetched = client.FetchTokens(root, tokens, 64, options, [&](const StreamedChunk&) { ++delivered; });
  if (!fetched.ok() || delivered != 2) return std::fprintf(stderr, "fetch delivered %u\n", delivered), 1;
  std::printf("consumer ok: %u chunks stored and fetched, %llu bytes\n", put->chunks_stored,
              static_cast<unsigned long long>(put->bytes));
  return 0;
}
