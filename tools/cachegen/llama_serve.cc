// cachegen llama-serve: an OpenAI-compatible completion server on llama.cpp
// whose long prompts load their KV prefix from a cachegen store.
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/profile.h"
#include "cachegen/service.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "codec/cachegen/profile_data.h"
#include "engine/llama/auto_profile.h"
#include "engine/llama/completion_engine.h"
#include "kv/io.h"
#include "serve/completion_server.h"
#include "stream_cli.h"

namespace cachegen::cli {
namespace {

struct LlamaServeArgs {
  std::string model, store_uri, cache_server, token_file, profile, listen = "127.0.0.1:8080";
  std::string api_key, api_key_file;  // the clients' bearer key (llama-server's flags)
  std::string cache_ram;  // SIZE of the host-memory tier in front of the store; empty: none
  LlamaServeOptions engine;
  uint32_t queue = 16, max_tokens = 1024;
  uint32_t max_prompt_tokens = 0;  // 0: the context size
};

Result<std::pair<std::string, int>> ParseListen(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return Status::InvalidArgument("--listen wants HOST:PORT, got '" + s + "'");
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    return Status::InvalidArgument("--listen: bad port '" + port + "'");
  return std::make_pair(s.substr(0, colon), std::stoi(port));
}

// The model's shared automatic profile in the store, when there and valid for the model.
std::shared_ptr<const Profile> ReadSharedProfile(ChunkStore& store, const ChunkKey& key, const LlamaModelInfo& info) {
  Result<std::vector<uint8_t>> bytes = store.Get(key, 0);
  if (!bytes.ok()) return nullptr;
  Result<std::shared_ptr<const Profile>> p = Profile::Parse(*bytes);
  if (!p.ok() || (*p)->layers() != info.layers || (*p)->kv_heads() != info.kv_heads ||
      (*p)->head_dim() != info.head_dim || (*p)->data().sensitivity.empty())
    return nullptr;
  return *p;
}

void ShareProfile(ChunkStore& store, const ChunkKey& key, const Profile& p) {
  if (Status st = store.Put(key, 0, p.bytes()); !st.ok())
    std::fprintf(stderr, "cachegen llama-serve: the profile could not be shared through the store: %s\n",
                 st.message().c_str());
}

// Learns the model's automatic profile on its own thread and hands it to the
// engine (caching starts then); Stop detaches a learner still at work, which
// then touches nothing of the server's.
class ProfileLearner {
 public:
  void Start(engine::AutoProfileOptions o, LlamaCompletionEngine* engine, ChunkStore* store, ChunkKey key,
             double max_kl) {
    thread_ = std::thread([s = state_, o, engine, store, key, max_kl] {
      Result<engine::AutoProfile> p = engine::AutoModelProfile(o);
      std::lock_guard lock(s->mu);
      if (s->stopped) return;
      if (!p.ok()) {
        std::fprintf(stderr, "cachegen llama-serve: no automatic profile (%s): chunks are coded without one\n",
                     p.status().message().c_str());
        if (Status st = engine->UseProfile(nullptr, 0); !st.ok())
          std::fprintf(stderr, "cachegen llama-serve: caching stays off: %s\n", st.message().c_str());
        return;
      }
      ShareProfile(*store, key, *p->profile);
      const double kl = max_kl > 0 ? max_kl : engine::DefaultBestLevelKl(*p->profile);
      if (Status st = engine->UseProfile(p->profile, kl); !st.ok()) {
        std::fprintf(stderr, "cachegen llama-serve: the automatic profile does not fit: %s\n", st.message().c_str());
        return;
      }
      std::printf("cachegen llama-serve: profile %016llx %s; caching on, best level at predicted KL %.3g\n",
                  static_cast<unsigned long long>(p->profile->id()), p->source.c_str(), kl);
      std::fflush(stdout);
    });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(state_->mu);
      state_->stopped = true;
    }
    thread_.detach();
  }
  ~ProfileLearner() { Stop(); }

 private:
  struct State {
    std::mutex mu;
    bool stopped = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

Result<std::unique_ptr<ChunkStore>> OpenBackingStore(const LlamaServeArgs& a) {
  if (!a.cache_server.empty()) {
    ClientOptions co;
    if (!a.token_file.empty()) {
      CG_ASSIGN_OR_RETURN(co.token, ReadTokenFile(a.token_file));
    }
    return ConnectService(a.cache_server, co);
  }
  if (a.store_uri.empty()) return std::unique_ptr<ChunkStore>();  // --cache-ram alone
  return OpenStore(a.store_uri);
}

// The configured store, behind the --cache-ram tier when there is one.
Result<std::unique_ptr<ChunkStore>> OpenCache(const LlamaServeArgs& a) {
  CG_ASSIGN_OR_RETURN(std::unique_ptr<ChunkStore> back, OpenBackingStore(a));
  if (a.cache_ram.empty()) return back;
  CG_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(a.cache_ram, "--cache-ram"));
  if (bytes == 0) return Status::InvalidArgument("--cache-ram must be more than 0 bytes");
  return WithMemoryTier(std::move(back), bytes);
}

int RunLlamaServe(LlamaServeArgs a) {
  Result<std::pair<std::string, int>> listen = ParseListen(a.listen);
  if (!listen.ok()) return Fail(listen.status());
  const bool rate_given = a.engine.codec.bits_per_value > 0 || a.engine.codec.max_kl > 0;
  if (!a.profile.empty() && a.profile != "none") {
    if (Status st = UseProfileFile(a.profile, /*quantizer_given=*/false, &a.engine.codec); !st.ok()) return Fail(st);
    if (!rate_given) a.engine.codec.max_kl = engine::DefaultBestLevelKl(*a.engine.codec.profile);
  }
  if (a.model.empty()) {
    Result<std::string> path = DefaultModelPath("llama-serve");
    if (!path.ok()) return Fail(path.status());
    a.model = *path;
  }
  Result<std::shared_ptr<LlamaModel>> model = LlamaModel::Load(a.model);
  if (!model.ok()) return Fail(model.status());
  Result<std::unique_ptr<ChunkStore>> store = OpenCache(a);
  if (!store.ok()) return Fail(store.status());
  Result<std::string> fp = ModelFingerprint(a.model, (*model)->info());
  if (!fp.ok()) return Fail(fp.status());
  a.engine.model_fingerprint = *fp;
  a.engine.model_name = a.model.substr(a.model.find_last_of('/') + 1);
  // The automatic profile: the store's shared one, else this machine's
  // cached one (then shared), else learned in the background while requests
  // are served without caching.
  const bool auto_profile = a.profile.empty() && a.engine.codec.codec == "cachegen";
  // A profile is learned for the cache it codes: other types than f16 have their own.
  const ChunkKey profile_key = ModelProfileKey(*fp + CacheTypesTag(a.engine.cache), engine::kAutoProfileSettings);
  std::string profile_note = a.profile.empty() ? "" : a.profile;
  // The server's model and fingerprint: the profile's lookup and learning load and hash nothing again.
  engine::AutoProfileOptions auto_options;
  auto_options.model_path = a.model;
  auto_options.model = *model;
  auto_options.fingerprint = *fp;
  auto_options.cache = a.engine.cache;
  if (auto_profile) {
    std::shared_ptr<const Profile> p = ReadSharedProfile(**store, profile_key, (*model)->info());
    profile_note = "automatic, shared through the store";
    if (!p) {
      if (Result<engine::AutoProfile> cached = engine::CachedModelProfile(auto_options); cached.ok()) {
        p = cached->profile;
        profile_note = "automatic, " + cached->source;
        ShareProfile(**store, profile_key, *p);
      }
    }
    if (p) {
      a.engine.codec.profile = p;
      a.engine.codec.quantizer = p->quantizer().value_or(a.engine.codec.quantizer);
      if (!rate_given) a.engine.codec.max_kl = engine::DefaultBestLevelKl(*p);
    } else {
      a.engine.defer_caching = true;
    }
  }
  Result<std::unique_ptr<LlamaCompletionEngine>> engine = LlamaCompletionEngine::Create(*model, store->get(), a.engine);
  if (!engine.ok()) return Fail(engine.status());
  ProfileLearner learner;
  if (a.engine.defer_caching) {
    std::printf("cachegen llama-serve: learning this model's profile in the background (once per model); until it is "
                "ready prompts are prefilled and not cached\n");
    learner.Start(auto_options, engine->get(), store->get(), profile_key, a.engine.codec.max_kl);
  }

  serve::CompletionServerOptions so;
  so.host = listen->first;
  so.port = listen->second;
  so.max_waiting = a.queue;
  so.limits.max_tokens = a.max_tokens;
  // Generous for text: a token is rarely more than 16 bytes.
  so.limits.max_prompt_bytes = 16ull * (a.max_prompt_tokens ? a.max_prompt_tokens : a.engine.n_ctx) + 4096;
  so.api_key = a.api_key;
  if (!a.api_key_file.empty()) {
    Result<std::string> key = ReadTokenFile(a.api_key_file);
    if (!key.ok()) return Fail(key.status());
    so.api_key = *key;
  }
  // Block the signals before the server's threads start, so only sigwait sees them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  Result<std::unique_ptr<serve::CompletionServer>> server = serve::CompletionServer::Start(engine->get(), so);
  if (!server.ok()) return Fail(server.status());
  std::printf("cachegen llama-serve: %s (%u layers, %u KV heads, head dim %u) on http://%s:%d, store %s, %u slot(s), "
              "chunks of %u tokens at %u level(s), prefill %.0f tokens/s\n",
              a.engine.model_name.c_str(), (*model)->info().layers, (*model)->info().kv_heads,
              (*model)->info().head_dim, so.host.c_str(), (*server)->port(), (*store)->uri().c_str(), a.engine.slots,
              a.engine.codec.chunk_tokens, a.engine.codec.levels, (*engine)->recompute_tokens_per_s());
  if (a.engine.codec.profile)
    std::printf("cachegen llama-serve: chunks coded with profile %016llx (%s)%s\n",
                static_cast<unsigned long long>(a.engine.codec.profile->id()), profile_note.c_str(),
                a.engine.codec.max_kl > 0 ? fmt::format(", best level at predicted KL {:.3g}", a.engine.codec.max_kl).c_str()
                                          : "");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  (*server)->Stop();
  learner.Stop();
  (*engine)->FlushStores();
  return 0;
}

const bool kRegistered = RegisterCommand(50, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<LlamaServeArgs>();
  a->engine.codec.levels = 4;
  CLI::App* sub = root.add_subcommand(
      "llama-serve", "OpenAI-compatible llama.cpp server whose prompts' KV prefixes load from a cachegen store");
  sub->add_option("--model", a->model, std::string("GGUF model (default: ") + kSharedModel + ", else a random-weight tiny model)");
  auto* st = sub->add_option("--store", a->store_uri, "Chunk store URI (file:///dir, mem://, redis://host:port, ...)");
  auto* cs = sub->add_option("--cache-server", a->cache_server, "A cachegen serve URL (http://host:port) instead");
  st->excludes(cs);
  cs->excludes(st);
  sub->add_option("--token-file", a->token_file, "Bearer token for --cache-server writes");
  sub->add_option("--cache-ram", a->cache_ram,
                  "Host-memory tier of this size (e.g. 1G) in front of --store/--cache-server, or alone: an LRU of "
                  "compressed chunk frames that loads go to first (what llama-server's --cache-ram keeps in f16)");
  sub->add_option("--listen", a->listen, "HOST:PORT")->capture_default_str();
  auto* key = sub->add_option("--api-key", a->api_key,
                              "Clients must send Authorization: Bearer KEY on every route but /healthz (401 otherwise)");
  auto* key_file = sub->add_option("--api-key-file", a->api_key_file, "File holding the API key (as --api-key)");
  key->excludes(key_file);
  key_file->excludes(key);
  sub->add_option("--slots", a->engine.slots, "Concurrent requests (one llama.cpp context each)")->capture_default_str();
  sub->add_option("--queue", a->queue, "Requests that may wait for a slot before 503")->capture_default_str();
  sub->add_option("--ctx", a->engine.n_ctx, "Context size per slot (tokens)")->capture_default_str();
  AddCacheTypeOptions(sub, &a->engine.cache, "every slot");
  sub->add_option("--threads", a->engine.threads, "llama.cpp threads per slot (0: its default)")->capture_default_str();
  sub->add_option("--threads-batch", a->engine.threads_batch,
                  "llama.cpp threads for prompt batches (0: as --threads)")
      ->capture_default_str();
  sub->add_option("--ttft-target", a->engine.ttft_target_ms, "Time-to-first-token target (ms): the cached prefix streams at the levels that fit it, less the measured one-token evaluation; 0 = none (best quality)")
      ->check(NonNegative())
      ->capture_default_str();
  sub->add_option("--chunk-tokens", a->engine.codec.chunk_tokens, "Tokens per stored chunk")->capture_default_str();
  sub->add_option("--levels", a->engine.codec.levels, "Quality levels stored per chunk")->capture_default_str();
  auto* ob = sub->add_option("--bits", a->engine.codec.bits_per_value, "Bits per value of the best level (0 = codec default)");
  auto* ok = sub->add_option("--max-kl", a->engine.codec.max_kl,
                             "Predicted KL of the best level (each next level: 3.16x more); default with a profile: half "
                             "the KL of the q8 codec on this model, measured when the profile was learned")
                 ->check(Positive());
  ob->excludes(ok);
  ok->excludes(ob);
  sub->add_option("--codec", a->engine.codec.codec, "Codec of stored chunks")->capture_default_str();
  sub->add_option("--profile", a->profile,
                  "cachegen: code stored chunks with this model profile (.cgprof from `profile train` on this model; "
                  "its quantizer too); none: without one; default: the model's automatic profile (from the store, "
                  "else this machine's cache, else learned in the background, then shared through the store)");
  sub->add_option("--max-tokens", a->max_tokens, "Largest max_tokens a request may ask for")->capture_default_str();
  sub->add_flag("!--no-store-new", a->engine.store_new_chunks, "Do not store new chunks after prefill");
  sub->add_flag("!--no-rope", a->engine.rope_keys, "Store keys as cached (post-RoPE); default: RoPE undone before coding");
  return [sub, a]() -> std::optional<int> {
    if (!*sub) return std::nullopt;
    if (a->store_uri.empty() && a->cache_server.empty() && a->cache_ram.empty())
      return Fail(Status::InvalidArgument("llama-serve needs --store URI, --cache-server URL or --cache-ram SIZE"));
    return RunLlamaServe(*a);
  };
});

}  // namespace
}  // namespace cachegen::cli
