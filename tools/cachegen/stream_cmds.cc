// cachegen put / fetch: store a context's chunks, stream them back under a deadline.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/profile.h"
#include "cachegen/service.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "kv/io.h"
#include "stream_cli.h"

namespace cachegen::cli {

void AddStoreTargetOptions(CLI::App* app, StoreTarget* t) {
  auto* s = app->add_option("--server", t->server, "cachegen service URL, http://HOST:PORT");
  auto* d = app->add_option("--store", t->store, "Store URI used directly (file:///path, mem://, redis://...)");
  s->excludes(d);
  d->excludes(s);
  app->add_option("--token-file", t->token_file, "Bearer token file for the service");
}

Result<std::string> ReadTokenFile(const std::string& path) {
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  std::string s(bytes.begin(), bytes.end());
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return Status::InvalidArgument("token file " + path + " is empty");
  return s.substr(b, e - b + 1);
}

Result<std::unique_ptr<ChunkStore>> OpenTarget(const StoreTarget& t, bool to_read) {
  if (t.server.empty() == t.store.empty()) return Status::InvalidArgument("give exactly one of --server and --store");
  if (!t.store.empty()) return OpenStore(t.store, {.create = !to_read});
  ClientOptions opts;
  if (!t.token_file.empty()) {
    CG_ASSIGN_OR_RETURN(opts.token, ReadTokenFile(t.token_file));
  }
  return ConnectService(t.server, opts);
}

namespace {

// What names a context's chain: model fingerprint, codec profile (with the
// model profile's id, when chunks are coded with one), chunk size.
struct ChainArgs {
  std::string model = "default", codec_profile = "default", model_profile;
  uint32_t chunk_tokens = kDefaultChunkTokens;
};
void AddChainOptions(CLI::App* app, ChainArgs* c, const char* model_profile_use) {
  app->add_option("--model", c->model, "Model fingerprint the KV belongs to (part of every chunk key)")
      ->capture_default_str();
  app->add_option("--codec-profile", c->codec_profile, "Name of the codec settings (part of every chunk key)")
      ->capture_default_str();
  app->add_option("--profile", c->model_profile, model_profile_use);
  app->add_option("--chunk-tokens", c->chunk_tokens, "Tokens per chunk")->capture_default_str();
}

// The chain's root; with --profile, the model profile is loaded and set in
// `config` with its quantizer (encoders code with it, decoders are given it).
Result<ChunkKey> LoadChain(const ChainArgs& c, uint32_t chunk_tokens, CodecConfig* config) {
  if (c.model_profile.empty()) return ChainRoot(c.model, c.codec_profile, chunk_tokens);
  CG_RETURN_IF_ERROR(UseProfileFile(c.model_profile, /*quantizer_given=*/false, config));
  return ChainRoot(c.model, WithModelProfile(c.codec_profile, config->profile->id()), chunk_tokens);
}

Result<std::vector<TokenId>> LoadTokens(const std::string& path) {
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  Result<std::vector<TokenId>> ids =
      ParseTokenIds(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!ids.ok()) return Status::InvalidArgument(path + ": " + ids.status().message());
  if (ids->empty()) return Status::InvalidArgument(path + ": no token ids");
  return ids;
}

struct PutArgs {
  StoreTarget target;
  ChainArgs chain;
  std::string input, tokens, codec = "cachegen";
  double bits = 0, max_kl = 0;
  uint32_t levels = 4, threads = 0;
  bool json = false;
  RopeArgs rope;  // KV input: keys' RoPE, undone before coding (as encode's)
};

int RunPut(const PutArgs& a) {
  Result<std::vector<TokenId>> tokens = LoadTokens(a.tokens);
  if (!tokens.ok()) return Fail(tokens.status());
  Result<std::unique_ptr<ChunkStore>> store = OpenTarget(a.target, false);
  if (!store.ok()) return Fail(store.status());
  Result<PutStats> stats = Status::Internal("unset");
  uint32_t chunk_tokens = a.chain.chunk_tokens;
  if (a.input.size() > 5 && a.input.substr(a.input.size() - 5) == ".cgkv") {
    Result<std::vector<uint8_t>> bytes = ReadFileBytes(a.input);
    if (!bytes.ok()) return Fail(bytes.status());
    Result<Decoder> dec = Decoder::Open(*bytes);
    if (!dec.ok()) return Fail(dec.status());
    chunk_tokens = dec->info().chunk_tokens ? dec->info().chunk_tokens : dec->info().shape.tokens;
    if (chunk_tokens != a.chain.chunk_tokens)
      return Fail(Status::InvalidArgument(a.input + " has " + std::to_string(chunk_tokens) +
                                          "-token chunks; pass --chunk-tokens " + std::to_string(chunk_tokens)));
    CodecConfig chain;
    Result<ChunkKey> root = LoadChain(a.chain, chunk_tokens, &chain);
    if (!root.ok()) return Fail(root.status());
    const ProfileSet profiles(chain.profile);
    stats = PutContainer(**store, *root, *tokens, *bytes, &profiles);
  } else {
    Result<KVTensor> kv = LoadInput(a.input);
    if (!kv.ok()) return Fail(kv.status());
    CodecConfig cfg;
    cfg.codec = a.codec;
    cfg.bits_per_value = a.bits;
    cfg.max_kl = a.max_kl;
    cfg.levels = a.levels;
    cfg.chunk_tokens = chunk_tokens;
    cfg.threads = a.threads;
    RopeArgs rope_args = a.rope;
    rope_args.input = a.input;
    Result<RopeConfig> rope = ResolveRope(rope_args);
    if (!rope.ok()) return Fail(rope.status());
    cfg.rope = *rope;
    if (chunk_tokens == 0) return Fail(Status::InvalidArgument("--chunk-tokens must be > 0"));
    Result<ChunkKey> root = LoadChain(a.chain, chunk_tokens, &cfg);
    if (!root.ok()) return Fail(root.status());
    Result<Encoder> enc = Encoder::Create(cfg);
    if (!enc.ok()) return Fail(enc.status());
    stats = PutContext(**store, *root, *tokens, kv->view(), *enc);
    if (stats.ok()) NoteSectionsUnlikeProfile(stats->sections_unlike_profile, stats->frames * 2 * kv->shape().layers);
  }
  if (!stats.ok()) return Fail(stats.status());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"chunks", stats->chunks},
                                       {"stored", stats->chunks_stored},
                                       {"skipped", stats->chunks_skipped},
                                       {"frames", stats->frames},
                                       {"bytes", stats->bytes},
                                       {"sections_unlike_profile", stats->sections_unlike_profile}}
                            .dump()
                            .c_str());
  } else {
    std::printf("put: %u chunks: %u stored (%llu frames, %llu bytes), %u already present\n", stats->chunks,
                stats->chunks_stored, static_cast<unsigned long long>(stats->frames),
                static_cast<unsigned long long>(stats->bytes), stats->chunks_skipped);
  }
  return 0;
}

struct FetchArgs {
  StoreTarget target;
  ChainArgs chain;
  std::string tokens, output, dtype = "f16";
  double deadline_ms = 0, recompute_tps = 0;
  uint32_t inflight = 4, threads = 1;
  int level = -1;
  bool json = false;
};

int RunFetch(const FetchArgs& a) {
  Result<std::vector<TokenId>> tokens = LoadTokens(a.tokens);
  if (!tokens.ok()) return Fail(tokens.status());
  Result<DType> dtype = ParseDType(a.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  if (a.chain.chunk_tokens == 0) return Fail(Status::InvalidArgument("--chunk-tokens must be > 0"));
  Result<std::unique_ptr<ChunkStore>> store = OpenTarget(a.target, true);
  if (!store.ok()) return Fail(store.status());
  StreamOptions opts;
  opts.deadline_ms = a.deadline_ms;
  opts.recompute_tokens_per_s = a.recompute_tps;
  opts.inflight = a.inflight;
  opts.fixed_level = a.level;
  opts.decode_threads = a.threads;
  opts.dtype = *dtype;
  // The delivered chunks, kept only when writing them out.
  std::vector<KVTensor> chunks;
  CodecConfig chain;
  Result<ChunkKey> root = LoadChain(a.chain, a.chain.chunk_tokens, &chain);
  if (!root.ok()) return Fail(root.status());
  opts.profiles = std::make_shared<const ProfileSet>(chain.profile);
  StreamClient client(store->get());
  Result<StreamResult> r = client.FetchTokens(
      *root, *tokens, a.chain.chunk_tokens, opts,
      [&](const StreamedChunk& c) {
        if (a.output.empty()) return;
        if (chunks.size() <= c.index) chunks.resize(c.index + 1);
        chunks[c.index] = *c.kv;
      });
  if (!r.ok()) return Fail(r.status());
  // An unreachable or failing store is an error, not an empty cache.
  const Status lookup_failed =
      r->lookup_status.ok() ? Status::Ok()
                            : Status::IOError("fetch: the store could not answer the lookup: " + r->lookup_status.ToString());
  // Output: the delivered chunks up to the first gap (never a hole filled with zeros).
  uint32_t written_tokens = 0;
  if (!a.output.empty()) {
    uint32_t k = 0;
    while (k < r->cached && r->levels[k] >= 0) ++k;
    if (k == 0)
      return Fail(lookup_failed.ok() ? Status::NotFound("fetch: no chunk delivered; nothing written to " + a.output)
                                     : lookup_failed);
    KVShape shape = chunks[0].shape();
    shape.tokens = 0;
    for (uint32_t i = 0; i < k; ++i) shape.tokens += chunks[i].shape().tokens;
    KVTensor all(shape, *dtype);
    for (uint32_t i = 0; i < k; ++i) {
      Status st = CopyKV(chunks[i].view(), all.view().Tokens(written_tokens, chunks[i].shape().tokens));
      if (!st.ok()) return Fail(st);
      written_tokens += chunks[i].shape().tokens;
    }
    Status st = WriteKV(a.output, all);
    if (!st.ok()) return Fail(st);
  }
  if (a.json) {
    nlohmann::json j{{"chunks", r->cached},
                     {"requested", r->requested},
                     {"levels", r->levels},
                     {"recompute", r->recompute},
                     {"errors", r->errors},
                     {"bytes", r->bytes},
                     {"elapsed_ms", r->elapsed_ms},
                     {"deadline_met", r->deadline_met},
                     {"timed_out", r->timed_out},
                     {"rejected", r->rejected},
                     {"fallbacks", r->fallbacks},
                     {"bandwidth_mbit_s", r->bandwidth_bytes_s * 8 / 1e6}};
    if (!a.output.empty()) j["written_tokens"] = written_tokens;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("fetch: %u of %u chunks cached; delivered %zu, recompute %zu; %llu bytes in %.1f ms (deadline %s)\n",
                r->cached, r->requested, r->cached - r->recompute.size(), r->recompute.size(),
                static_cast<unsigned long long>(r->bytes), r->elapsed_ms, r->deadline_met ? "met" : "missed");
    for (const std::string& e : r->errors) std::printf("  error: %s\n", e.c_str());
    if (!a.output.empty()) std::printf("wrote %u tokens to %s\n", written_tokens, a.output.c_str());
  }
  if (!lookup_failed.ok()) return Fail(lookup_failed);  // after what was fetched is out
  return 0;
}

const bool kPut = RegisterCommand(21, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<PutArgs>();
  CLI::App* sub = root.add_subcommand("put", "Store a context's chunks at every quality level");
  AddStoreTargetOptions(sub, &a->target);
  AddChainOptions(sub, &a->chain,
                  "Model profile (.cgprof) the chunks are coded with: a KV input is encoded with it (and its "
                  "quantizer); a .cgkv coded with one needs it. Its id is part of every chunk key");
  sub->add_option("input", a->input, "KV file (.npy, .safetensors, .kvraw), synthetic:L,H,D,T[,seed], or a .cgkv")
      ->required();
  sub->add_option("--tokens", a->tokens, "File of the context's token ids (whitespace/comma separated)")->required();
  sub->add_option("--codec", a->codec, "Codec (KV input only)")->capture_default_str();
  auto* ob = sub->add_option("--bits", a->bits, "Finest level's bits per value (cachegen codec; 0 = default)");
  auto* ok = sub->add_option("--max-kl", a->max_kl,
                             "Finest level's predicted KL (each next level: 3.16x more; needs --profile with sensitivities)")
                 ->check(Positive());
  ob->excludes(ok);
  ok->excludes(ob);
  sub->add_option("--levels", a->levels, "Quality levels per chunk (KV input only)")->capture_default_str();
  sub->add_option("--threads", a->threads, "Encoder threads (0 = all cores)")->capture_default_str();
  AddRopeOptions(sub, &a->rope, /*model_flag=*/false);
  sub->add_flag("--json", a->json, "Print a JSON summary");
  return [sub, a] { return *sub ? std::optional<int>(RunPut(*a)) : std::nullopt; };
});

const bool kFetch = RegisterCommand(22, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<FetchArgs>();
  CLI::App* sub = root.add_subcommand("fetch", "Stream a context's cached chunks under a deadline");
  AddStoreTargetOptions(sub, &a->target);
  AddChainOptions(sub, &a->chain,
                  "Model profile (.cgprof) the chunks were put with (decoding needs it; its id is part of every "
                  "chunk key)");
  sub->add_option("--tokens", a->tokens, "File of the context's token ids")->required();
  sub->add_option("--deadline-ms", a->deadline_ms, "Deadline for the whole transfer")->required();
  sub->add_option("--recompute-tps", a->recompute_tps,
                  "Engine recompute speed in tokens/s (0: never plan recompute)")->capture_default_str();
  sub->add_option("--inflight", a->inflight, "Requests in flight")->capture_default_str();
  sub->add_option("--level", a->level,
                  "Fetch every chunk at this level (no adaptation); a chunk not stored at it comes at the nearest "
                  "coarser stored level, else the nearest finer (--json's levels say which)")
      ->check(CLI::Range(0, 7));
  sub->add_option("--threads", a->threads, "Decode threads")->capture_default_str();
  sub->add_option("--dtype", a->dtype, "Output dtype: f32, f16, bf16")->capture_default_str();
  sub->add_option("-o,--output", a->output, "Write the delivered prefix as a KV file (.npy, .safetensors, .kvraw)");
  sub->add_flag("--json", a->json, "Print {chunks, levels, recompute, bytes, elapsed_ms, deadline_met, ...}");
  return [sub, a] { return *sub ? std::optional<int>(RunFetch(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
