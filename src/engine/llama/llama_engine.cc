// The llama.cpp adapter: model/context lifetime, evaluation, and KV capture and
// injection through the sequence-state blob (engine/llama_state.h).
#include "cachegen/llama_engine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include "engine/llama/cache_rotation.h"
#include "engine/llama/ggml_quantizer.h"
#include "engine/llama_state.h"

#ifndef CACHEGEN_LLAMA_BACKEND_DIR
#define CACHEGEN_LLAMA_BACKEND_DIR ""
#endif

namespace cachegen {
namespace {

constexpr const char* kEvalAborted = "evaluation aborted: the engine is stopping";
constexpr const char* kEvalCancelled = "evaluation cancelled: the client has gone";

// While set, this thread's llama.cpp errors are collected here instead of
// printed: a failed model load reports its first one in our error line.
thread_local std::string* captured_errors = nullptr;

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level != GGML_LOG_LEVEL_ERROR) return;
  if (captured_errors) {
    *captured_errors += text;
    return;
  }
  std::fputs(text, stderr);
}

std::string Meta(const llama_model* m, const std::string& key) {
  char buf[256];
  const int32_t n = llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}

Result<ggml_type> CacheType(const std::string& name) {
  CG_ASSIGN_OR_RETURN(int32_t id, engine::GgmlCacheTypeByName(name));
  return static_cast<ggml_type>(id);
}

}  // namespace

RopeConfig CodecRope(const LlamaModelInfo& info) {
  RopeConfig r;
  if (info.rope.kind != RopeParams::Kind::kNormal && info.rope.kind != RopeParams::Kind::kNeox) return r;
  r.kind = info.rope.kind == RopeParams::Kind::kNeox ? RopeConfig::Kind::kNeox : RopeConfig::Kind::kNormal;
  r.dims = info.rope.dims;
  r.freq_base = info.rope.freq_base;
  r.freq_scale = info.rope.freq_scale;
  return r;
}

bool PositionsFrom(std::span<const int32_t> positions, int32_t first) {
  for (size_t t = 0; t < positions.size(); ++t)
    if (int64_t{positions[t]} != int64_t{first} + static_cast<int64_t>(t)) return false;
  return true;
}

Status LlamaInit() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    const char* log = std::getenv("CACHEGEN_LLAMA_LOG");
    if (!(log && std::strcmp(log, "1") == 0)) llama_log_set(QuietLog, nullptr);
    const char* dir = std::getenv("CACHEGEN_LLAMA_BACKENDS");
    if (!dir || !*dir) dir = CACHEGEN_LLAMA_BACKEND_DIR;
    if (*dir) {
      ggml_backend_load_all_from_path(dir);
    } else {
      ggml_backend_load_all();
    }
    llama_backend_init();
    ok = ggml_backend_dev_count() > 0;
  });
  if (!ok) {
    return Status::Internal(
        "llama.cpp: no compute backend loaded (set CACHEGEN_LLAMA_BACKENDS to the folder with libggml-cpu-*.so)");
  }
  return Status::Ok();
}

Result<std::shared_ptr<LlamaModel>> LlamaModel::Load(const std::string& path) {
  CG_RETURN_IF_ERROR(LlamaInit());
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::NotFound("cannot open model '" + path + "'");
  std::fclose(f);
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  std::string errors;
  captured_errors = &errors;
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  captured_errors = nullptr;
  if (!m) {
    const std::string first = errors.substr(0, errors.find('\n'));
    return Status::InvalidArgument("llama.cpp could not load model '" + path + "'" + (first.empty() ? "" : ": " + first));
  }
  std::shared_ptr<LlamaModel> out(new LlamaModel());
  out->model_ = m;
  if (llama_model_is_recurrent(m) || llama_model_is_hybrid(m)) {
    return Status::Unsupported("model '" + path + "' is recurrent or hybrid: its state is not a plain KV cache");
  }
  LlamaModelInfo& in = out->info_;
  in.architecture = Meta(m, "general.architecture");
  in.layers = static_cast<uint32_t>(llama_model_n_layer(m));
  in.heads = static_cast<uint32_t>(llama_model_n_head(m));
  in.kv_heads = static_cast<uint32_t>(llama_model_n_head_kv(m));
  in.embd = static_cast<uint32_t>(llama_model_n_embd(m));
  const std::string key_len = Meta(m, in.architecture + ".attention.key_length");
  in.head_dim = !key_len.empty() ? static_cast<uint32_t>(std::strtoul(key_len.c_str(), nullptr, 10))
                                 : (in.heads ? in.embd / in.heads : 0);
  const llama_vocab* vocab = llama_model_get_vocab(m);
  in.vocab = static_cast<uint32_t>(llama_vocab_n_tokens(vocab));
  in.ctx_train = static_cast<uint32_t>(llama_model_n_ctx_train(m));
  in.bos = llama_vocab_bos(vocab);
  in.eos = llama_vocab_eos(vocab);
  in.params = llama_model_n_params(m);
  switch (llama_model_rope_type(m)) {
    case LLAMA_ROPE_TYPE_NONE: in.rope.kind = RopeParams::Kind::kNone; break;
    case LLAMA_ROPE_TYPE_NORM: in.rope.kind = RopeParams::Kind::kNormal; break;
    case LLAMA_ROPE_TYPE_NEOX: in.rope.kind = RopeParams::Kind::kNeox; break;
    default: in.rope.kind = RopeParams::Kind::kOther; break;
  }
  const std::string dims = Meta(m, in.architecture + ".rope.dimension_count");
  in.rope.dims = !dims.empty() ? static_cast<uint32_t>(std::strtoul(dims.c_str(), nullptr, 10)) : in.head_dim;
  const std::string base = Meta(m, in.architecture + ".rope.freq_base");
  if (!base.empty()) in.rope.freq_base = std::strtod(base.c_str(), nullptr);
  in.rope.freq_scale = llama_model_rope_freq_scale_train(m);
  if (in.layers == 0 || in.kv_heads == 0 || in.head_dim == 0) {
    return Status::Unsupported("model '" + path + "' has no attention KV cache shape");
  }
  return out;
}

LlamaModel::~LlamaModel() {
  if (model_) llama_model_free(model_);
}

Result<std::vector<int32_t>> LlamaModel::Tokenize(const std::string& text) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  if (text.size() > static_cast<size_t>(INT32_MAX / 2)) return Status::InvalidArgument("text too long to tokenize");
  std::vector<int32_t> out(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                             static_cast<int32_t>(out.size()), false, false);
  if (n < 0 && n != INT32_MIN) {
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                       static_cast<int32_t>(out.size()), false, false);
  }
  if (n < 0) return Status::Internal("llama.cpp tokenization failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string LlamaModel::Detokenize(std::span<const int32_t> tokens) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::string out;
  char buf[256];
  for (int32_t t : tokens) {
    const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<std::unique_ptr<LlamaContext>> LlamaContext::Create(std::shared_ptr<LlamaModel> model,
                                                           const LlamaContextOptions& options) {
  if (!model) return Status::InvalidArgument("no model");
  CG_ASSIGN_OR_RETURN(ggml_type type_k, CacheType(options.cache.k));
  CG_ASSIGN_OR_RETURN(ggml_type type_v, CacheType(options.cache.v));
  if (options.n_seq == 0 || options.n_ctx == 0) return Status::InvalidArgument("n_ctx and n_seq must be > 0");
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = options.n_ctx;
  cp.n_batch = options.n_ctx;
  cp.n_ubatch = std::min<uint32_t>(options.n_ctx, 512);
  cp.n_seq_max = options.n_seq;
  // Small models run fastest single-threaded (thread wake-ups cost more than their layers).
  const uint32_t hw = std::max(1u, std::thread::hardware_concurrency());
  const uint32_t auto_threads = model->info().params < 50'000'000 ? 1u : std::min(4u, hw);
  const int32_t threads = static_cast<int32_t>(options.threads ? options.threads : auto_threads);
  cp.n_threads = threads;
  cp.n_threads_batch = options.threads_batch ? static_cast<int32_t>(options.threads_batch) : threads;
  cp.type_k = type_k;
  cp.type_v = type_v;
  cp.flash_attn_type = options.flash_attn < 0   ? LLAMA_FLASH_ATTN_TYPE_AUTO
                       : options.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                 : LLAMA_FLASH_ATTN_TYPE_ENABLED;
  cp.kv_unified = options.unified;
  cp.no_perf = true;
  cp.offload_kqv = false;
  std::unique_ptr<LlamaContext> out(new LlamaContext());
  if (options.query_observer) {
    cp.cb_eval = &LlamaContext::ObserveQueries;
    cp.cb_eval_user_data = out.get();
  }
  cp.abort_callback = &LlamaContext::ShouldAbort;
  cp.abort_callback_data = out.get();
  llama_context* ctx = llama_init_from_model(model->raw(), cp);
  if (!ctx) {
    return Status::InvalidArgument("llama.cpp could not create a context (cache " + options.cache.ToString() +
                                   ", flash attention " + std::to_string(options.flash_attn) +
                                   "; block-32 types need a head dim that is a multiple of 32, a quantized V "
                                   "flash attention)");
  }
  out->model_ = std::move(model);
  out->options_ = options;
  out->ctx_ = ctx;
  out->type_k_ = static_cast<int32_t>(type_k);
  out->type_v_ = static_cast<int32_t>(type_v);
  if (options.model_basis) out->rotation_ = CacheRotationOf(out->model_->info(), options.cache);
  {
    // Probe the state layout llama.cpp writes here (V transposed or not, per-cell
    // extension bytes): evaluate one token, parse its blob, clear.
    const int32_t tok = std::max(0, out->model_->info().bos);
    CG_RETURN_IF_ERROR(out->Eval(std::span<const int32_t>(&tok, 1), 0, 0, false));
    CG_ASSIGN_OR_RETURN(auto blob, out->StateBlob(0));
    CG_ASSIGN_OR_RETURN(auto st, engine::ParseLlamaSeqState(blob));
    out->Clear();
    if (st.sections.size() != 1 || st.sections[0].streams.size() != 1) {
      return out;  // sliding-window or other layouts: Capture reports kUnsupported
    }
    out->v_trans_ = st.sections[0].streams[0].v_trans;
    out->cell_ext_bytes_ = st.cell_ext_bytes;
  }
  out->observing_ = static_cast<bool>(out->options_.query_observer);
  return out;
}

// llama.cpp's graph names each layer's query "Qcur-<layer>" at every step of
// its making; the output of the RoPE node is the query attention uses.
bool LlamaContext::ShouldAbort(void* self) {
  const auto* c = static_cast<const LlamaContext*>(self);
  return (c->options_.abort && c->options_.abort->load()) || (c->cancelled_ && c->cancelled_());
}

bool LlamaContext::ObserveQueries(ggml_tensor* t, bool ask, void* user) {
  auto* self = static_cast<LlamaContext*>(user);
  int layer = -1;
  if (!self->observing_ || t->op != GGML_OP_ROPE || std::sscanf(t->name, "Qcur-%d", &layer) != 1 || layer < 0 ||
      static_cast<size_t>(layer) >= self->query_pos_.size() || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t))
    return !ask;  // ask: not wanted; otherwise: keep computing
  if (ask) return true;
  const size_t n = ggml_nelements(t);
  self->query_buf_.resize(n);
  ggml_backend_tensor_get(t, self->query_buf_.data(), 0, n * sizeof(float));
  const int32_t pos = self->query_pos_[layer];
  self->query_pos_[layer] += static_cast<int32_t>(t->ne[2]);  // tokens of this micro-batch
  self->options_.query_observer(static_cast<uint32_t>(layer), pos, self->query_buf_);
  return true;
}

LlamaContext::~LlamaContext() {
  if (ctx_) llama_free(ctx_);
}

void LlamaContext::Clear() { llama_memory_clear(llama_get_memory(ctx_), true); }

Status LlamaContext::Truncate(int32_t seq, int32_t pos) {
  if (!llama_memory_seq_rm(llama_get_memory(ctx_), seq, pos, -1)) {
    return Status::Internal("llama.cpp could not remove positions >= " + std::to_string(pos));
  }
  return Status::Ok();
}

Status LlamaContext::Eval(std::span<const int32_t> tokens, int32_t pos0, int32_t seq, bool all_logits) {
  if (tokens.empty()) return Status::InvalidArgument("no tokens to evaluate");
  if (tokens.size() > options_.n_ctx) return Status::InvalidArgument("more tokens than the context holds");
  if (options_.abort && options_.abort->load()) return Status::Unavailable(kEvalAborted);
  if (cancelled_ && cancelled_()) return Status::Unavailable(kEvalCancelled);
  const uint32_t vocab = model_->info().vocab;
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= vocab) return Status::InvalidArgument("token id out of range");
  }
  llama_batch batch = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = pos0 + static_cast<int32_t>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = all_logits || i + 1 == tokens.size();
  }
  batch.n_tokens = static_cast<int32_t>(tokens.size());
  if (observing_) query_pos_.assign(model_->info().layers, pos0);
  // llama.cpp's error lines are kept: an abort is no error to log, and a
  // failure reports them in its status.
  std::string errors;
  captured_errors = &errors;
  const int32_t rc = llama_decode(ctx_, batch);
  captured_errors = nullptr;
  llama_batch_free(batch);
  if (rc == 2 && options_.abort && options_.abort->load()) return Status::Unavailable(kEvalAborted);
  if (rc == 2 && cancelled_ && cancelled_()) return Status::Unavailable(kEvalCancelled);
  if (rc != 0) {
    while (!errors.empty() && errors.back() == '\n') errors.pop_back();
    return Status::Internal("llama_decode failed (" + std::to_string(rc) + ")" + (errors.empty() ? "" : ": " + errors));
  }
  outputs_ = all_logits ? tokens.size() : 1;
  first_output_ = all_logits ? 0 : tokens.size() - 1;
  logits_.resize(outputs_ * vocab);
  for (size_t i = 0; i < outputs_; ++i) {
    const float* l = llama_get_logits_ith(ctx_, static_cast<int32_t>(all_logits ? i : tokens.size() - 1));
    if (!l) return Status::Internal("llama.cpp returned no logits");
    std::memcpy(logits_.data() + i * vocab, l, vocab * sizeof(float));
  }
  return Status::Ok();
}

std::span<const float> LlamaContext::Logits(size_t i) const {
  const uint32_t vocab = model_->info().vocab;
  if (i < first_output_ || i - first_output_ >= outputs_) return {};
  return std::span<const float>(logits_).subspan((i - first_output_) * vocab, vocab);
}

Result<std::vector<uint8_t>> LlamaContext::StateBlob(int32_t seq) const {
  const size_t size = llama_state_seq_get_size(ctx_, seq);
  if (size == 0) return Status::Internal("llama.cpp reports no state for sequence " + std::to_string(seq));
  std::vector<uint8_t> blob(size);
  const size_t n = llama_state_seq_get_data(ctx_, blob.data(), blob.size(), seq);
  if (n != size) return Status::Internal("llama.cpp wrote " + std::to_string(n) + " of " + std::to_string(size) +
                                         " state bytes");
  return blob;
}

Status LlamaContext::SetStateBlob(int32_t seq, std::span<const uint8_t> blob) {
  if (llama_state_seq_set_data(ctx_, blob.data(), blob.size(), seq) == 0) {
    return Status::InvalidArgument("llama.cpp refused the sequence state (layout, types or size do not match)");
  }
  return Status::Ok();
}

Result<CapturedKV> LlamaContext::Capture(int32_t seq) {
  CG_ASSIGN_OR_RETURN(auto blob, StateBlob(seq));
  CG_ASSIGN_OR_RETURN(auto st, engine::ParseLlamaSeqState(blob, cell_ext_bytes_));
  size_t streams = 0;
  for (const auto& sec : st.sections) streams += sec.streams.size();
  if (streams == 0) return Status::NotFound("sequence " + std::to_string(seq) + " holds no tokens");
  CG_ASSIGN_OR_RETURN(KVTensor kv,
                      engine::ExtractLlamaKV(blob, st, model_->info().kv_heads, &engine::LlamaGgmlQuantizer()));
  if (kv.shape().head_dim != model_->info().head_dim) {
    return Status::Unsupported("captured head dim " + std::to_string(kv.shape().head_dim) + " differs from the model's " +
                               std::to_string(model_->info().head_dim));
  }
  // Only quantized parts are rotated, and a quantized cache is captured in f32.
  if (rotation_.any()) engine::ApplyCacheRotation(rotation_, kv.view());
  return CapturedKV{std::move(kv), st.sections[0].streams[0].pos};
}

Status LlamaContext::Inject(int32_t seq, const KVView& kv, std::span<const int32_t> positions) {
  const LlamaModelInfo& in = model_->info();
  const KVShape& s = kv.shape();
  if (s.layers != in.layers || s.kv_heads != in.kv_heads || s.head_dim != in.head_dim) {
    return Status::InvalidArgument("KV shape " + s.ToString() + " does not match the model (L=" +
                                   std::to_string(in.layers) + " H=" + std::to_string(in.kv_heads) +
                                   " D=" + std::to_string(in.head_dim) + ")");
  }
  if (seq < 0 || static_cast<uint32_t>(seq) >= options_.n_seq) {
    return Status::InvalidArgument("sequence " + std::to_string(seq) + " out of range");
  }
  if (s.tokens > options_.n_ctx) return Status::InvalidArgument("more tokens than the context holds");
  engine::LlamaSeqLayout layout;
  layout.seq_id = seq;
  layout.n_stream = options_.unified ? 1 : options_.n_seq;
  layout.stream = options_.unified ? 0 : static_cast<uint32_t>(seq);
  layout.cell_ext_bytes = cell_ext_bytes_;
  layout.v_trans = v_trans_;
  layout.k_type = type_k_;
  layout.v_type = type_v_;
  layout.pos.assign(positions.begin(), positions.end());
  const bool rotate = rotation_.any();
  KVTensor rotated(rotate ? s : KVShape{}, DType::kF32);
  if (rotate) {
    CG_RETURN_IF_ERROR(CopyKV(kv, rotated.view()));
    engine::ApplyCacheRotation(rotation_, rotated.view());
  }
  CG_ASSIGN_OR_RETURN(auto blob, engine::WriteLlamaSeqState(layout, rotate ? rotated.view() : kv,
                                                            &engine::LlamaGgmlQuantizer()));
  return SetStateBlob(seq, blob);
}

Status LlamaContext::Append(int32_t seq, int32_t scratch, const KVView& kv, int32_t pos0) {
  if (!options_.unified) return Status::Unsupported("Append needs a unified KV cache (one stream)");
  const auto n_seq = static_cast<int32_t>(options_.n_seq);
  if (seq < 0 || seq >= n_seq || scratch < 0 || scratch >= n_seq || scratch == seq) {
    return Status::InvalidArgument("Append: sequence " + std::to_string(seq) + " and scratch sequence " +
                                   std::to_string(scratch) + " must be distinct and below " + std::to_string(n_seq));
  }
  llama_memory_t mem = llama_get_memory(ctx_);
  const llama_pos last = llama_memory_seq_pos_max(mem, seq);  // -1: empty
  if (pos0 != last + 1) {
    return Status::InvalidArgument("Append at position " + std::to_string(pos0) + ", but sequence " +
                                   std::to_string(seq) + " ends at " + std::to_string(last));
  }
  if (llama_memory_seq_pos_max(mem, scratch) >= 0) {
    return Status::InvalidArgument("Append: scratch sequence " + std::to_string(scratch) + " is not empty");
  }
  std::vector<int32_t> pos(kv.shape().tokens);
  std::iota(pos.begin(), pos.end(), pos0);
  Status st = Inject(scratch, kv, pos);
  if (st.ok()) llama_memory_seq_cp(mem, scratch, seq, -1, -1);
  llama_memory_seq_rm(mem, scratch, -1, -1);
  return st;
}

}  // namespace cachegen
