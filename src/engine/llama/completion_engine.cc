#include "engine/llama/completion_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <llama.h>
#include <xxhash.h>

#include "cachegen/profile.h"
#include "cachegen/stream.h"
#include "cachegen/stream_client.h"
#include "serve/openai.h"

namespace cachegen {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kScratchSeq = 1;  // LlamaContext::Append's staging sequence

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The codec settings that change a chunk's bytes, as the key chain's profile:
// chunks written under other settings are other chunks.
std::string CodecProfile(const CodecConfig& c) {
  std::string p = c.codec + ";levels=" + std::to_string(c.levels) + ";bits=" + std::to_string(c.bits_per_value) +
                  ";snr=" + std::to_string(c.snr_db) + ";maxerr=" + std::to_string(c.max_rel_error) +
                  (c.max_kl > 0 ? ";kl=" + std::to_string(c.max_kl) : std::string()) +
                  ";g=" + std::to_string(c.group_tokens) + ";rot=" + std::to_string(c.rotate) +
                  ";slope=" + std::to_string(c.layer_slope) + ";recent=" + std::to_string(c.recent_tokens) + "x" +
                  std::to_string(c.recent_step_scale);
  if (c.rope.kind != RopeConfig::Kind::kNone)
    p += ";rope=" + std::to_string(static_cast<int>(c.rope.kind)) + "x" + std::to_string(c.rope.dims) + "x" +
         std::to_string(c.rope.freq_base) + "x" + std::to_string(c.rope.freq_scale);
  for (double b : c.level_bits) p += ";lb=" + std::to_string(b);
  if (c.quantizer != CodecConfig::Quantizer::kUniform) p += ";q=" + std::to_string(static_cast<int>(c.quantizer));
  return c.profile ? WithModelProfile(p, c.profile->id()) : p;
}

// Whether `encoder` codes this model's KV: a profile for another shape, RoPE
// or quantizer is refused here, at start-up, not at every store.
Status CheckEncoderFitsModel(const Encoder& encoder, const LlamaModelInfo& info) {
  KVTensor one_token(KVShape{info.layers, info.kv_heads, info.head_dim, 1}, DType::kF16);
  Result<std::vector<uint8_t>> bytes = encoder.Encode(one_token.view());
  if (!bytes.ok()) return Status::InvalidArgument("the codec settings do not fit this model: " + bytes.status().message());
  return Status::Ok();
}

// Bytes of `text` that end on a whole UTF-8 character: a token may end
// inside a multi-byte character, which the next token completes.
size_t Utf8CompleteLength(const std::string& text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

std::string TokenPiece(const llama_vocab* vocab, llama_token t) {
  char buf[256];
  const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, false);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A llama.cpp sampler chain for one request.
struct Sampler {
  llama_sampler* chain = nullptr;
  explicit Sampler(const serve::CompletionRequest& req) {
    chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (req.temperature <= 0) {
      llama_sampler_chain_add(chain, llama_sampler_init_greedy());
      return;
    }
    if (req.top_p < 1) llama_sampler_chain_add(chain, llama_sampler_init_top_p(req.top_p, 1));
    llama_sampler_chain_add(chain, llama_sampler_init_temp(req.temperature));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(static_cast<uint32_t>(req.seed)));
  }
  ~Sampler() { llama_sampler_free(chain); }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
};

}  // namespace

Result<std::string> ModelFingerprint(const std::string& gguf_path, const LlamaModelInfo& info) {
  std::ifstream in(gguf_path, std::ios::binary);
  if (!in) return Status::IOError("cannot open '" + gguf_path + "'");
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_128bits_update(st, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  char hex[40];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return info.architecture + ":" + std::to_string(info.layers) + "x" + std::to_string(info.kv_heads) + "x" +
         std::to_string(info.head_dim) + ":" + hex;
}

std::string CacheTypesTag(const LlamaCacheTypes& cache) {
  if (cache == LlamaCacheTypes{}) return "";
  return ":kv=" + cache.k + "/" + cache.v;
}

Result<std::unique_ptr<LlamaCompletionEngine>> LlamaCompletionEngine::Create(std::shared_ptr<LlamaModel> model,
                                                                              ChunkStore* store,
                                                                              const LlamaServeOptions& options) {
  if (!model) return Status::InvalidArgument("no model");
  if (options.slots == 0 || options.slots > 64) return Status::InvalidArgument("slots must be 1..64");
  if (options.codec.chunk_tokens == 0) return Status::InvalidArgument("chunk tokens must be > 0");
  std::unique_ptr<LlamaCompletionEngine> e(new LlamaCompletionEngine());
  e->model_ = std::move(model);
  e->store_ = store;
  e->stream_client_ = std::make_unique<StreamClient>(store);
  e->options_ = options;
  if (options.rope_keys && options.codec.rope.kind == RopeConfig::Kind::kNone)
    e->options_.codec.rope = CodecRope(e->model_->info());
  LlamaContextOptions co;
  co.n_ctx = options.n_ctx;
  co.cache = options.cache;
  co.model_basis = true;  // chunks of a rotated cache are coded in the model's basis
  co.threads = options.threads;
  co.threads_batch = options.threads_batch;
  co.n_seq = 2;  // sequence 0 holds the request, kScratchSeq stages injected chunks
  co.unified = true;
  co.abort = &e->aborting_;
  for (uint32_t i = 0; i < options.slots; ++i) {
    Result<std::unique_ptr<LlamaContext>> ctx = LlamaContext::Create(e->model_, co);
    if (!ctx.ok()) return ctx.status();
    e->contexts_.push_back(std::move(*ctx));
  }
  if (store && options.model_fingerprint.empty())
    return Status::InvalidArgument("a model fingerprint is needed to address stored chunks");
  if (!options.defer_caching) {
    CG_ASSIGN_OR_RETURN(e->coding_, MakeCoding(e->model_->info(), e->options_, e->options_.codec));
  }
  e->model_name_ = options.model_name.empty() ? e->model_->info().architecture : options.model_name;
  e->recompute_tokens_per_s_ = options.recompute_tokens_per_s;
  if (e->recompute_tokens_per_s_ <= 0) {
    Status st = e->MeasurePrefillSpeed();
    if (!st.ok()) return st;
  }
  e->token_eval_ms_ = options.token_eval_ms;
  if (e->token_eval_ms_ <= 0) {
    Status st = e->MeasureTokenEval();
    if (!st.ok()) return st;
  }
  e->store_thread_ = std::thread([p = e.get()] { p->StoreWorker(); });
  return e;
}

Result<std::shared_ptr<const LlamaCompletionEngine::ChunkCoding>> LlamaCompletionEngine::MakeCoding(
    const LlamaModelInfo& info, const LlamaServeOptions& o, const CodecConfig& codec) {
  auto c = std::make_shared<ChunkCoding>();
  c->codec = codec;
  CG_ASSIGN_OR_RETURN(Encoder enc, Encoder::Create(codec));
  c->encoder = std::make_unique<Encoder>(std::move(enc));
  if (codec.profile) CG_RETURN_IF_ERROR(CheckEncoderFitsModel(*c->encoder, info));
  c->profiles = std::make_shared<const ProfileSet>(codec.profile);
  c->root = ChainRoot(o.model_fingerprint + CacheTypesTag(o.cache), CodecProfile(codec),
                      codec.chunk_tokens);
  return std::shared_ptr<const ChunkCoding>(std::move(c));
}

std::shared_ptr<const LlamaCompletionEngine::ChunkCoding> LlamaCompletionEngine::Coding() const {
  std::lock_guard lock(coding_mu_);
  return coding_;
}

ChunkKey LlamaCompletionEngine::chain_root() const {
  const auto c = Coding();
  return c ? c->root : ChunkKey{};
}

Status LlamaCompletionEngine::UseProfile(std::shared_ptr<const Profile> profile, double max_kl) {
  CodecConfig codec = options_.codec;
  if (profile) {
    codec.profile = profile;
    codec.quantizer = profile->quantizer().value_or(codec.quantizer);
  }
  if (profile && max_kl > 0) {
    codec.max_kl = max_kl;
    codec.bits_per_value = 0;
    codec.level_bits.clear();
  }
  CG_ASSIGN_OR_RETURN(std::shared_ptr<const ChunkCoding> c, MakeCoding(model_->info(), options_, codec));
  std::lock_guard lock(coding_mu_);
  coding_ = std::move(c);
  return Status::Ok();
}

LlamaCompletionEngine::~LlamaCompletionEngine() {
  {
    std::lock_guard lock(store_mu_);
    stopping_ = true;
  }
  store_cv_.notify_all();
  if (store_thread_.joinable()) store_thread_.join();
}

// The planner trades transfer time against recompute time, so it needs this
// engine's prefill speed on this machine: one chunk's worth of tokens, timed.
Status LlamaCompletionEngine::MeasurePrefillSpeed() {
  LlamaContext& ctx = *contexts_[0];
  const uint32_t n = std::min<uint32_t>(options_.codec.chunk_tokens, options_.n_ctx);
  std::vector<int32_t> tokens(n);
  const uint32_t vocab = model_->info().vocab;
  for (uint32_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7919u + 13u) % vocab);
  ctx.Clear();
  const auto t0 = Clock::now();
  Status st = ctx.Eval(tokens, 0);
  const double ms = MsSince(t0);
  ctx.Clear();
  if (!st.ok()) return st;
  recompute_tokens_per_s_ = n / std::max(ms, 1e-3) * 1000.0;
  return Status::Ok();
}

// One token evaluated alone, the best of three (the first also pages the
// weights in): the least a cached prompt still costs after its transfer.
Status LlamaCompletionEngine::MeasureTokenEval() {
  LlamaContext& ctx = *contexts_[0];
  const int32_t tok = std::max(0, model_->info().bos);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    ctx.Clear();
    const auto t0 = Clock::now();
    Status st = ctx.Eval(std::span<const int32_t>(&tok, 1), 0);
    const double ms = MsSince(t0);
    if (!st.ok()) return st;
    best = i == 0 ? ms : std::min(best, ms);
  }
  ctx.Clear();
  token_eval_ms_ = std::max(best, 1e-3);
  return Status::Ok();
}

Result<CapturedKV> LlamaCompletionEngine::Capture(uint32_t slot) {
  if (slot >= contexts_.size()) return Status::InvalidArgument("no such slot");
  return contexts_[slot]->Capture(0);
}

Result<PutStats> LlamaCompletionEngine::StoreContext(std::span<const int32_t> tokens, const KVView& kv) {
  if (!store_) return Status::InvalidArgument("no store to put chunks in");
  const auto coding = Coding();
  if (!coding) return Status::Unsupported("caching is deferred until the model's profile is ready");
  return PutContext(*store_, coding->root, tokens, kv, *coding->encoder);
}

Result<std::vector<int32_t>> LlamaCompletionEngine::PromptTokens(const serve::CompletionRequest& req) const {
  if (!req.chat && !req.prompt_tokens.empty()) {
    const uint32_t vocab = model_->info().vocab;
    for (int32_t t : req.prompt_tokens)
      if (t < 0 || static_cast<uint32_t>(t) >= vocab)
        return Status::InvalidArgument("prompt token id " + std::to_string(t) + " is outside the vocabulary");
    return req.prompt_tokens;
  }
  std::string text = req.prompt;
  bool parse_special = false;
  if (req.chat) {
    // The model's own template when it has one; otherwise "role: content" lines.
    const char* tmpl = llama_model_chat_template(model_->raw(), nullptr);
    std::vector<llama_chat_message> msgs;
    for (const serve::ChatMessage& m : req.messages) msgs.push_back({m.role.c_str(), m.content.c_str()});
    std::vector<char> buf(4096);
    int32_t n = tmpl ? llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, buf.data(),
                                                 static_cast<int32_t>(buf.size()))
                     : -1;
    if (n > static_cast<int32_t>(buf.size())) {
      buf.resize(static_cast<size_t>(n));
      n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, buf.data(), n);
    }
    if (n >= 0) {
      text.assign(buf.data(), static_cast<size_t>(n));
      parse_special = true;
    } else {
      text.clear();
      for (const serve::ChatMessage& m : req.messages) text += m.role + ": " + m.content + "\n";
      text += "assistant:";
    }
  }
  const llama_vocab* vocab = llama_model_get_vocab(model_->raw());
  std::vector<llama_token> tokens(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                             static_cast<int32_t>(tokens.size()), true, parse_special);
  if (n < 0) return Status::InvalidArgument("prompt does not tokenize");
  tokens.resize(static_cast<size_t>(n));
  if (tokens.empty()) return Status::InvalidArgument("prompt has no tokens");
  return tokens;
}

Result<PrefillResult> LlamaCompletionEngine::Prefill(uint32_t slot, std::span<const int32_t> tokens,
                                                     double ttft_target_ms) {
  if (slot >= contexts_.size()) return Status::InvalidArgument("no such slot");
  if (tokens.empty()) return Status::InvalidArgument("empty prompt");
  if (tokens.size() >= options_.n_ctx)
    return Status::InvalidArgument("prompt of " + std::to_string(tokens.size()) + " tokens does not fit the context of " +
                                   std::to_string(options_.n_ctx));
  LlamaContext& ctx = *contexts_[slot];
  ctx.Clear();
  PrefillResult out;
  serve::Timings& t = out.timings;
  t.prompt_tokens = static_cast<uint32_t>(tokens.size());
  const uint32_t T = options_.codec.chunk_tokens;
  const uint32_t cacheable = static_cast<uint32_t>((tokens.size() - 1) / T);  // whole chunks before the last token

  uint32_t prefix = 0;    // tokens in the sequence, contiguous from token 0
  uint32_t injected = 0;  // of them, the tokens whose KV came from the store
  double gap_ms = 0;      // evaluating chunks that were not delivered
  const std::shared_ptr<const ChunkCoding> coding = Coding();
  if (store_ && coding && cacheable > 0) {
    Status inject_status;
    StreamOptions so;
    // The TTFT target less what follows the transfer (the uncached tail's
    // evaluation) is the stream's deadline.
    const double deadline = ttft_target_ms > 0 ? ttft_target_ms : options_.ttft_target_ms;
    const auto tail_tokens = static_cast<double>(tokens.size() - size_t{cacheable} * T);
    const double tail_ms = std::max(token_eval_ms_, tail_tokens / recompute_tokens_per_s_ * 1000.0);
    so.deadline_ms = deadline > 0 ? std::max(deadline - tail_ms, 1.0) : 1e9;
    so.recompute_tokens_per_s = recompute_tokens_per_s_;
    so.inflight = options_.inflight;
    so.decode_threads = options_.decode_threads;
    so.levels = options_.codec.levels;
    so.cancel = &aborting_;
    so.profiles = coding->profiles;
    // A chunk of another shape (another model's, misplaced) is a miss.
    const LlamaModelInfo& info = model_->info();
    so.shape = KVShape{info.layers, info.kv_heads, info.head_dim, 0};
    // Without a deadline there is nothing to trade: always the best level.
    so.fixed_level = deadline > 0 ? options_.fixed_level : std::max(options_.fixed_level, 0);
    // The last request's bandwidth estimate, so the first chunk need not probe.
    so.initial_bandwidth_bytes_s = last_bandwidth_bytes_s_.load();
    // Each chunk goes into the sequence as it arrives (in chunk order), while
    // the next ones are still on the wire or being decoded.
    Result<StreamResult> r = stream_client_->FetchTokens(
        coding->root, tokens.first(cacheable * T), T, so, [&](const StreamedChunk& c) {
          t.levels.push_back(c.level);
          if (!inject_status.ok()) return;
          const uint32_t start = c.index * T;
          if (start > prefix) {
            // The chunks before this one were not delivered (failed, or sent
            // back for recompute). llama.cpp refuses position gaps, so their
            // text is evaluated now, while later chunks are still in flight,
            // and this chunk and the ones after it are still injected.
            const auto g0 = Clock::now();
            inject_status = ctx.Eval(tokens.subspan(prefix, start - prefix), static_cast<int32_t>(prefix));
            gap_ms += MsSince(g0);
            if (!inject_status.ok()) return;
            prefix = start;
          }
          const auto i0 = Clock::now();
          inject_status = ctx.Append(0, kScratchSeq, c.kv->view(), static_cast<int32_t>(prefix));
          t.inject_ms += MsSince(i0);
          if (inject_status.ok()) {
            prefix += T;
            injected += T;
          }
        });
    if (!r.ok()) return r.status();
    if (aborting_.load()) return Status::Unavailable("prefill aborted: the engine is stopping");  // not a store failure
    if (!r->errors.empty()) {
      // The request goes on (what failed is recomputed); the operator sees it.
      std::lock_guard lock(store_mu_);
      fetch_errors_ += r->errors.size();
      if (!r->lookup_status.ok()) LogLookupFailure(r->lookup_status);
    }
    if (!inject_status.ok()) return inject_status;
    if (r->bandwidth_bytes_s > 0) last_bandwidth_bytes_s_ = r->bandwidth_bytes_s;
    t.lookup_ms = r->lookup_ms;
    t.transfer_ms = r->elapsed_ms;
    t.decode_ms = r->decode_ms;
    t.transfer_bytes = r->bytes;
    out.recompute_chunks = r->recompute;
  }
  t.cached_tokens = injected;
  t.recomputed_tokens = t.prompt_tokens - injected;
  const auto p0 = Clock::now();
  Status st = ctx.Eval(tokens.subspan(prefix), static_cast<int32_t>(prefix));
  t.prefill_ms = gap_ms + MsSince(p0);
  if (!st.ok()) return st;

  const uint32_t whole = static_cast<uint32_t>(tokens.size() / T);
  if (store_ && coding && options_.store_new_chunks && whole * T > injected) {
    Result<CapturedKV> cap = ctx.Capture(0);
    if (cap.ok()) EnqueueStore(std::vector<int32_t>(tokens.begin(), tokens.begin() + whole * T), std::move(*cap));
  }
  return out;
}

Result<serve::CompletionResult> LlamaCompletionEngine::Complete(
    uint32_t slot, const serve::CompletionRequest& req, const std::function<bool(const std::string&)>& on_text) {
  const auto t0 = Clock::now();
  if (slot >= contexts_.size()) return Status::InvalidArgument("no such slot");
  LlamaContext& ctx = *contexts_[slot];
  // A client that has gone ends this request's evaluations (prefill and
  // generation) early.
  ctx.SetCancel(req.client_gone);
  struct CancelScope {
    LlamaContext& ctx;
    ~CancelScope() { ctx.SetCancel({}); }
  } cancel_scope{ctx};
  Result<std::vector<int32_t>> tokens = PromptTokens(req);
  if (!tokens.ok()) return tokens.status();
  Result<PrefillResult> pre = Prefill(slot, *tokens, req.ttft_target_ms);
  if (!pre.ok()) return pre.status();
  serve::CompletionResult res;
  res.timings = pre->timings;
  const llama_vocab* vocab = llama_model_get_vocab(model_->raw());
  Sampler sampler(req);
  int32_t pos = static_cast<int32_t>(tokens->size());
  size_t sent = 0;
  res.finish_reason = "length";
  const auto g0 = Clock::now();
  for (uint32_t i = 0; i < req.max_tokens; ++i) {
    const llama_token tok = llama_sampler_sample(sampler.chain, ctx.raw(), -1);
    if (i == 0) res.timings.ttft_ms = MsSince(t0);
    if (llama_vocab_is_eog(vocab, tok)) {
      res.finish_reason = "stop";
      break;
    }
    ++res.timings.completion_tokens;
    res.text += TokenPiece(vocab, tok);
    if (std::optional<size_t> at = serve::FindStop(res.text, req.stop)) {
      res.text.resize(*at);
      res.finish_reason = "stop";
      break;
    }
    const size_t ready = std::min(serve::StreamableLength(res.text, req.stop), Utf8CompleteLength(res.text));
    if (ready > sent) {
      if (!on_text(res.text.substr(sent, ready - sent))) break;
      sent = ready;
    }
    if (i + 1 == req.max_tokens) break;
    if (static_cast<uint32_t>(pos) + 1 >= options_.n_ctx) break;  // context full: "length"
    Status st = ctx.Eval(std::span<const int32_t>(&tok, 1), pos++);
    if (!st.ok()) return st;
  }
  if (res.text.size() > sent) on_text(res.text.substr(sent));
  res.timings.generation_ms = MsSince(g0);
  return res;
}

void LlamaCompletionEngine::EnqueueStore(std::vector<int32_t> tokens, CapturedKV captured) {
  constexpr size_t kMaxQueued = 4;
  {
    std::lock_guard lock(store_mu_);
    if (store_queue_.size() >= kMaxQueued) {
      store_queue_.pop_front();
      ++store_dropped_;
    }
    store_queue_.push_back({std::move(tokens), std::move(captured)});
  }
  store_cv_.notify_all();
}

void LlamaCompletionEngine::StoreWorker() {
  std::unique_lock lock(store_mu_);
  for (;;) {
    store_cv_.wait(lock, [&] { return stopping_ || !store_queue_.empty(); });
    if (store_queue_.empty()) return;  // stopping, nothing left
    StoreJob job = std::move(store_queue_.front());
    store_queue_.pop_front();
    store_busy_ = true;
    lock.unlock();
    const KVView kv = job.captured.kv.view().Tokens(0, static_cast<uint32_t>(job.tokens.size()));
    const auto coding = Coding();
    Result<PutStats> put = coding ? PutContext(*store_, coding->root, job.tokens, kv, *coding->encoder)
                                  : Status::Unsupported("caching is deferred");
    lock.lock();
    store_busy_ = false;
    if (put.ok()) {
      stored_chunks_ += put->chunks_stored;
      stored_bytes_ += put->bytes;
      if (put->sections_unlike_profile > 0 && sections_unlike_profile_ == 0)
        std::fprintf(stderr,
                     "cachegen llama-serve: %llu sections of the chunks stored were coded with their own statistics: "
                     "their KV is far from the profile's training data (is it this model's profile?)\n",
                     static_cast<unsigned long long>(put->sections_unlike_profile));
      sections_unlike_profile_ += put->sections_unlike_profile;
    } else {
      ++store_errors_;
      std::fprintf(stderr, "cachegen llama-serve: storing chunks failed: %s\n", put.status().message().c_str());
    }
    store_cv_.notify_all();
  }
}

void LlamaCompletionEngine::LogLookupFailure(const Status& st) {
  constexpr std::chrono::seconds kLookupLogInterval{10};
  const Clock::time_point now = Clock::now();
  if (last_lookup_log_ != Clock::time_point{} && now - last_lookup_log_ < kLookupLogInterval) {
    ++lookup_failures_unlogged_;
    return;
  }
  std::string more;
  if (lookup_failures_unlogged_ > 0)
    more = " (and " + std::to_string(lookup_failures_unlogged_) + " more since the last report)";
  std::fprintf(stderr, "cachegen llama-serve: cache lookup failed: %s%s\n", st.message().c_str(), more.c_str());
  last_lookup_log_ = now;
  lookup_failures_unlogged_ = 0;
}

void LlamaCompletionEngine::FlushStores() {
  std::unique_lock lock(store_mu_);
  store_cv_.wait(lock, [&] { return store_queue_.empty() && !store_busy_; });
}

// The store's own counters (with --cache-ram: its host-memory tier's): reads
// that hit and missed, and what it holds where it keeps count.
std::string LlamaCompletionEngine::StoreMetricsText() const {
  if (!store_) return "";
  const StoreStats s = store_->stats();
  std::string out;
  auto add = [&out](const char* name, const char* type, uint64_t v) {
    out += fmt::format("# TYPE cachegen_llama_store_{} {}\ncachegen_llama_store_{} {}\n", name, type, name, v);
  };
  add("hits_total", "counter", s.hits);
  add("misses_total", "counter", s.misses);
  add("evictions_total", "counter", s.evictions);
  add("held_bytes", "gauge", s.held_bytes);
  add("held_frames", "gauge", s.held_frames);
  return out;
}

std::string LlamaCompletionEngine::MetricsText() const {
  const bool caching = Coding() != nullptr;
  std::lock_guard lock(store_mu_);
  return std::string("# TYPE cachegen_llama_caching gauge\ncachegen_llama_caching ") + (caching ? "1" : "0") +
         "\n# TYPE cachegen_llama_stored_chunks_total counter\ncachegen_llama_stored_chunks_total " +
         std::to_string(stored_chunks_) + "\n# TYPE cachegen_llama_stored_bytes_total counter\n" +
         "cachegen_llama_stored_bytes_total " + std::to_string(stored_bytes_) +
         "\n# TYPE cachegen_llama_store_errors_total counter\ncachegen_llama_store_errors_total " +
         std::to_string(store_errors_) +
         "\n# TYPE cachegen_llama_store_dropped_total counter\ncachegen_llama_store_dropped_total " +
         std::to_string(store_dropped_) +
         "\n# TYPE cachegen_llama_fetch_errors_total counter\ncachegen_llama_fetch_errors_total " +
         std::to_string(fetch_errors_) +
         "\n# TYPE cachegen_llama_sections_unlike_profile_total counter\ncachegen_llama_sections_unlike_profile_total " +
         std::to_string(sections_unlike_profile_) + "\n" + StoreMetricsText();
}

}  // namespace cachegen
