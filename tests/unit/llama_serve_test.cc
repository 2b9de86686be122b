// llama-serve's engine on a real model (../shared/models/stories260K.gguf;
// without it, on a random-weight model):
// a repeated prompt loads its prefix from the store, and with a lossless
// codec the completion is the same as with a full prefill.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cachegen/profile.h"
#include "cachegen/stream.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/profile_train.h"
#include "serve/completion_server.h"
#include "http_test_client.h"
#include "random_model_fixture.h"

namespace cachegen {
namespace {


// Without ../shared (a clean clone, CI) the suite runs on the tiny
// random-weight model instead: its text means nothing, but the engine's
// paths (lookup, fetch, inject, recompute, store) are the same.
class LlamaServeTest : public TinyRandomModelTest {
 protected:
  void SetUp() override {
    // About 300 tokens either way (660 characters of stories260K's vocabulary).
    ModelAndText m = SharedOrRandomModel("data/tinystories/dev.txt", 660, 300);
    ASSERT_TRUE(m.model);
    llama_ = m.model;
    model_path_ = m.path;
    prompt_ = m.text;
    auto s = OpenStore("mem://");
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(*s);
  }

  static LlamaServeOptions Options(const std::string& codec, uint32_t levels) {
    LlamaServeOptions o;
    o.n_ctx = 512;
    o.codec.codec = codec;
    o.codec.levels = levels;
    o.codec.chunk_tokens = 64;
    o.model_fingerprint = "stories260K-test";
    o.recompute_tokens_per_s = 1e5;
    return o;
  }
  std::unique_ptr<LlamaCompletionEngine> Engine(const std::string& codec, uint32_t levels) {
    return Engine(Options(codec, levels));
  }
  std::unique_ptr<LlamaCompletionEngine> Engine(const LlamaServeOptions& o) {
    auto e = LlamaCompletionEngine::Create(llama_, store_.get(), o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(*e) : nullptr;
  }

  serve::CompletionRequest Request() const {
    serve::CompletionRequest r;
    r.prompt = prompt_;
    r.max_tokens = 24;
    r.temperature = 0;
    return r;
  }

  // Options whose chunks are coded with a quick profile of this model (no
  // sensitivities, learned from windows of the prompt, with or without
  // undoing RoPE) and its quantizer.
  LlamaServeOptions ProfileOptions(bool rope) const {
    LlamaServeOptions o = Options("cachegen", 2);
    engine::ModelProfileOptions po;
    po.model_path = model_path_;
    po.text = prompt_;
    po.contexts = 2;
    po.context = 64;
    po.continuation = 16;
    po.rope = rope;
    po.sensitivity = false;
    po.tuning.quantizer = CodecConfig::Quantizer::kLloyd;
    auto trained = engine::TrainModelProfile(po);
    EXPECT_TRUE(trained.ok()) << trained.status().message();
    if (trained.ok()) o.codec.profile = trained->profile;
    o.codec.quantizer = po.tuning.quantizer;
    return o;
  }

  std::shared_ptr<LlamaModel> llama_;
  std::string model_path_;
  std::unique_ptr<ChunkStore> store_;
  std::string prompt_;
};

auto Ignore = [](const std::string&) { return true; };

TEST_F(LlamaServeTest, SecondRequestLoadsItsPrefixAndGeneratesTheSameWithALosslessCodec) {
  auto engine = Engine("fp16", 1);
  ASSERT_TRUE(engine);
  auto tokens = engine->PromptTokens(Request());
  ASSERT_TRUE(tokens.ok());
  ASSERT_GT(tokens->size(), 200u);
  const uint32_t cacheable = static_cast<uint32_t>((tokens->size() - 1) / 64) * 64;

  auto first = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->timings.cached_tokens, 0u);
  EXPECT_EQ(first->timings.recomputed_tokens, tokens->size());
  EXPECT_GT(first->timings.completion_tokens, 0u);
  engine->FlushStores();

  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->timings.cached_tokens, cacheable);
  EXPECT_EQ(second->timings.recomputed_tokens, tokens->size() - cacheable);
  EXPECT_GT(second->timings.transfer_bytes, 0u);
  EXPECT_EQ(second->text, first->text);  // fp16 KV of an f16 cache is exact
}

// A first request through an fp16 engine, its chunks stored: the stored
// chunk keys, the prompt tokens and the first answer's text.
struct Stored {
  std::vector<ChunkKey> keys;
  std::vector<int32_t> tokens;
  std::string text;
};
Stored CompleteAndStore(LlamaCompletionEngine& engine, const serve::CompletionRequest& req) {
  Stored s;
  auto first = engine.Complete(0, req, Ignore);
  EXPECT_TRUE(first.ok());
  engine.FlushStores();
  auto tokens = engine.PromptTokens(req);
  EXPECT_TRUE(tokens.ok());
  if (!first.ok() || !tokens.ok()) return s;
  s.tokens = *tokens;
  s.text = first->text;
  s.keys = ChunkKeys(engine.chain_root(), s.tokens, 64);
  return s;
}

TEST_F(LlamaServeTest, AMissingChunkEndsTheCachedPrefixAndTheRestIsRecomputed) {
  auto engine = Engine("fp16", 1);
  ASSERT_TRUE(engine);
  const Stored first = CompleteAndStore(*engine, Request());
  ASSERT_GT(first.keys.size(), 2u);
  ASSERT_TRUE(store_->Delete(first.keys[2], 0).ok());
  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->timings.cached_tokens, 128u);
  EXPECT_EQ(second->text, first.text);
}

// A chunk that is found but cannot be decoded is recomputed from its text in
// place, and the chunks after it are still injected (not prefilled).
TEST_F(LlamaServeTest, AnUndecodableChunkIsRecomputedAndTheChunksAfterItStillLoad) {
  auto engine = Engine("fp16", 1);
  ASSERT_TRUE(engine);
  const Stored first = CompleteAndStore(*engine, Request());
  ASSERT_GT(first.keys.size(), 3u);
  const uint32_t cacheable = static_cast<uint32_t>((first.tokens.size() - 1) / 64) * 64;
  const std::vector<uint8_t> junk(300, 0xab);
  ASSERT_TRUE(store_->Put(first.keys[1], 0, junk).ok());
  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->timings.cached_tokens, cacheable - 64);
  EXPECT_EQ(second->timings.recomputed_tokens, first.tokens.size() - (cacheable - 64));
  EXPECT_EQ(second->text, first.text);
  EXPECT_NE(engine->MetricsText().find("cachegen_llama_fetch_errors_total 1\n"), std::string::npos)
      << engine->MetricsText();
}

// A store that answers nothing (a cache server that is down).
class DownStore : public ChunkStore {
 public:
  Status Put(const ChunkKey&, uint32_t, std::span<const uint8_t>) override { return Down(); }
  Result<std::vector<uint8_t>> Get(const ChunkKey&, uint32_t) override { return Down(); }
  Result<uint64_t> Size(const ChunkKey&, uint32_t) override { return Down(); }
  Status Delete(const ChunkKey&, uint32_t) override { return Down(); }
  StoreStats stats() const override { return {}; }
  std::string uri() const override { return "down://"; }

 private:
  static Status Down() { return Status::IOError("store down"); }
};

// With its store down, every request is served by a full prefill; the
// failed lookups count in /metrics and are logged once, not per request.
TEST_F(LlamaServeTest, AStoreThatIsDownCostsAPrefillAndOneLogLine) {
  DownStore down;
  store_.reset();
  LlamaServeOptions o;
  o.n_ctx = 512;
  o.codec.codec = "fp16";
  o.codec.levels = 1;
  o.codec.chunk_tokens = 64;
  o.model_fingerprint = "stories260K-test";
  auto engine = LlamaCompletionEngine::Create(llama_, &down, o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto tokens = (*engine)->PromptTokens(Request());
  ASSERT_TRUE(tokens.ok());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    auto r = (*engine)->Complete(0, Request(), Ignore);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->timings.cached_tokens, 0u);
    EXPECT_EQ(r->timings.recomputed_tokens, tokens->size());
  }
  (*engine)->FlushStores();
  const std::string log = testing::internal::GetCapturedStderr();
  size_t lines = 0;
  const std::string line = "cache lookup failed";
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << log;
  EXPECT_NE(log.find("store down"), std::string::npos) << log;
  EXPECT_NE((*engine)->MetricsText().find("cachegen_llama_fetch_errors_total 3\n"), std::string::npos)
      << (*engine)->MetricsText();
}

// After Abort (a server's Stop), a request fails at once, whether its
// prefix is cached or not, and counts no fetch error.
TEST_F(LlamaServeTest, AnAbortedEngineServesNoMore) {
  auto engine = Engine("fp16", 1);
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->Complete(0, Request(), Ignore).ok());
  engine->FlushStores();
  engine->Abort();
  auto r = engine->Complete(0, Request(), Ignore);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("aborted"), std::string::npos) << r.status().message();
  EXPECT_NE(engine->MetricsText().find("cachegen_llama_fetch_errors_total 0\n"), std::string::npos)
      << engine->MetricsText();
}

TEST_F(LlamaServeTest, LossyChunksLoadAndGenerate) {
  auto engine = Engine("cachegen", 2);
  ASSERT_TRUE(engine);
  auto first = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(first.ok());
  engine->FlushStores();
  // The model's own profile on its own KV: every section uses the profile's statistics.
  EXPECT_NE(engine->MetricsText().find("cachegen_llama_sections_unlike_profile_total 0\n"), std::string::npos)
      << engine->MetricsText();
  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_GT(second->timings.cached_tokens, 0u);
  EXPECT_EQ(second->timings.levels.size(), second->timings.cached_tokens / 64);
  EXPECT_GT(second->timings.completion_tokens, 0u);
}

// A quantized, Hadamard-rotated engine cache (q8_0 on the random model's
// head dim 64) behind a host-memory tier: chunks are stored under keys that
// name the cache types, load from memory, and the metrics show the tier.
TEST_F(LlamaServeTest, AQuantizedCacheStoresAndLoadsThroughAMemoryTier) {
  ASSERT_TRUE(model_);
  LlamaServeOptions o = Options("cachegen", 2);
  o.cache = {"q8_0", "q8_0"};
  auto tier = WithMemoryTier(nullptr, 64ull << 20);
  auto e = LlamaCompletionEngine::Create(*model_, tier.get(), o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto engine = std::move(*e);
  auto f16 = LlamaCompletionEngine::Create(*model_, tier.get(), Options("cachegen", 2));
  ASSERT_TRUE(f16.ok());
  EXPECT_NE((*f16)->chain_root(), engine->chain_root());  // other values, other keys
  serve::CompletionRequest r = Request();
  r.prompt.clear();
  while (r.prompt.size() < 300) r.prompt += "the dog ran to the park. ";
  auto first = engine->Complete(0, r, Ignore);
  ASSERT_TRUE(first.ok()) << first.status().message();
  engine->FlushStores();
  auto second = engine->Complete(0, r, Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  auto tokens = engine->PromptTokens(r);
  ASSERT_TRUE(tokens.ok());
  const uint32_t cacheable = static_cast<uint32_t>((tokens->size() - 1) / 64) * 64;
  EXPECT_GE(cacheable, 128u);
  EXPECT_EQ(second->timings.cached_tokens, cacheable);
  EXPECT_GT(second->timings.completion_tokens, 0u);
  const std::string metrics = engine->MetricsText();
  EXPECT_NE(metrics.find("cachegen_llama_store_hits_total "), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("cachegen_llama_store_held_bytes 0\n"), std::string::npos) << metrics;
  EXPECT_GT(tier->stats().hits, 0u);
}

// Chunks coded with a model profile load, and only under that profile: its
// id is part of the chunk keys.
TEST_F(LlamaServeTest, ChunksCodedWithAProfileLoadUnderThatProfileOnly) {
  const LlamaServeOptions o = ProfileOptions(/*rope=*/true);
  ASSERT_TRUE(o.codec.profile);
  auto engine = Engine(o);
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->Complete(0, Request(), Ignore).ok());
  engine->FlushStores();
  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_GT(second->timings.cached_tokens, 0u);
  EXPECT_GT(second->timings.completion_tokens, 0u);
  LlamaServeOptions without = o;  // the same but for the profile
  without.codec.profile = nullptr;
  auto plain = Engine(without);
  ASSERT_TRUE(plain);
  auto other = plain->Complete(0, Request(), Ignore);
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_EQ(other->timings.cached_tokens, 0u);
}

// Deferred caching (llama-serve while it learns the model's automatic
// profile): prompts are prefilled and nothing is stored until UseProfile;
// then chunks are coded with the profile, under its keys, and load.
TEST_F(LlamaServeTest, DeferredCachingStartsWhenAProfileArrives) {
  LlamaServeOptions o = ProfileOptions(/*rope=*/true);
  std::shared_ptr<const Profile> profile = o.codec.profile;
  ASSERT_TRUE(profile);
  o.codec.profile = nullptr;
  o.defer_caching = true;
  auto engine = Engine(o);
  ASSERT_TRUE(engine);
  EXPECT_FALSE(engine->caching());
  EXPECT_NE(engine->MetricsText().find("cachegen_llama_caching 0\n"), std::string::npos);
  ASSERT_TRUE(engine->Complete(0, Request(), Ignore).ok());
  engine->FlushStores();
  EXPECT_EQ(store_->stats().puts, 0u);
  auto again = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->timings.cached_tokens, 0u);

  ASSERT_TRUE(engine->UseProfile(profile, 0).ok());
  EXPECT_TRUE(engine->caching());
  EXPECT_NE(engine->MetricsText().find("cachegen_llama_caching 1\n"), std::string::npos);
  const Stored first = CompleteAndStore(*engine, Request());
  EXPECT_GT(store_->stats().puts, 0u);
  LlamaServeOptions with = Options("cachegen", 2);
  with.codec.profile = profile;
  with.codec.quantizer = CodecConfig::Quantizer::kLloyd;
  with.codec.rope = CodecRope(llama_->info());
  auto same = Engine(with);  // the keys of an engine started with that profile
  ASSERT_TRUE(same);
  EXPECT_EQ(same->chain_root(), engine->chain_root());
  auto second = engine->Complete(0, Request(), Ignore);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_GT(second->timings.cached_tokens, 0u);
  // Without a profile (learning failed): the options' codec, other keys.
  const ChunkKey with_profile = engine->chain_root();
  ASSERT_TRUE(engine->UseProfile(nullptr, 0).ok());
  EXPECT_NE(engine->chain_root(), with_profile);
}

// A profile the encoder cannot use on this model (learned with RoPE left in
// the keys, while the engine undoes it) fails at start-up, not at every store.
TEST_F(LlamaServeTest, AProfileThatDoesNotFitFailsAtStartUp) {
  const LlamaServeOptions o = ProfileOptions(/*rope=*/false);
  ASSERT_TRUE(o.codec.profile);
  auto e = LlamaCompletionEngine::Create(llama_, store_.get(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("do not fit this model"), std::string::npos) << e.status().message();
}

TEST_F(LlamaServeTest, OverHttpTheSecondRequestReportsCachedTokens) {
  auto engine = Engine("cachegen", 1);
  ASSERT_TRUE(engine);
  auto server = serve::CompletionServer::Start(engine.get(), {});
  ASSERT_TRUE(server.ok()) << server.status().message();
  testing_http::Client client("127.0.0.1", (*server)->port(), 60000);
  const std::string body = nlohmann::json({{"prompt", prompt_}, {"max_tokens", 8}, {"temperature", 0}}).dump();
  auto r1 = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->status, 200) << r1->body;
  engine->FlushStores();
  auto r2 = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200) << r2->body;
  auto j1 = nlohmann::json::parse(r1->body), j2 = nlohmann::json::parse(r2->body);
  EXPECT_EQ(j1["timings"]["cached_tokens"], 0);
  EXPECT_GT(j2["timings"]["cached_tokens"].get<int>(), 0);
  EXPECT_GT(j2["timings"]["ttft_ms"].get<double>(), 0);
  // A prompt longer than the context is a 400, not a crash.
  std::string huge;
  for (int i = 0; i < 600; ++i) huge += "the dog ran. ";
  auto r3 = client.Post("/v1/completions", nlohmann::json({{"prompt", huge}}).dump(), "application/json");
  ASSERT_TRUE(r3);
  EXPECT_EQ(r3->status, 400) << r3->body;
  (*server)->Stop();
}

}  // namespace
}  // namespace cachegen
