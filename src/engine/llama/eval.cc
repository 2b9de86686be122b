#include "engine/llama/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "cachegen/profile.h"
#include "engine/llama_state.h"

namespace cachegen::engine {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> SplitStories(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex sep("(^|\n)<\\|endoftext\\|>(\n|$)");
  std::sregex_token_iterator it(text.begin(), text.end(), sep, -1), end;
  for (; it != end; ++it) {
    std::string s = *it;
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string::npos) continue;
    const size_t b = s.find_last_not_of(" \t\r\n");
    out.push_back(s.substr(a, b - a + 1));
  }
  return out;
}

// log-softmax of logits into out (double for the sums, float storage).
void LogSoftmax(std::span<const float> logits, std::vector<float>& out) {
  out.resize(logits.size());
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double{l} - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - lse);
}

size_t ArgMax(std::span<const float> v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

// What one scoring pass of one window produced.
struct Scored {
  std::vector<std::vector<float>> logp;  // per scored position, log-probs
  std::vector<int32_t> greedy;
};

// Scores window `w` in `ctx`, whose sequence 0 holds the KV of tokens [0, N).
Status Score(LlamaContext& ctx, const std::vector<int32_t>& w, uint32_t N, uint32_t M, uint32_t G, Scored* out) {
  CG_RETURN_IF_ERROR(TeacherForcedLogProbs(ctx, w, N, M, &out->logp));
  CG_RETURN_IF_ERROR(ctx.Truncate(0, static_cast<int32_t>(N)));
  out->greedy.clear();
  int32_t cur = w[N];
  for (uint32_t g = 0; g < G; ++g) {
    CG_RETURN_IF_ERROR(ctx.Eval(std::span<const int32_t>(&cur, 1), static_cast<int32_t>(N + g)));
    cur = static_cast<int32_t>(ArgMax(ctx.Logits(0)));
    out->greedy.push_back(cur);
  }
  return Status::Ok();
}

struct Accum {
  double nll = 0, kl = 0, top1 = 0, greedy = 0, bits = 0, encode_s = 0, decode_s = 0;
  double predicted_kl = 0;  // sum over windows; < 0 once a window had none
  uint64_t scored = 0, greedy_n = 0, windows = 0;
  void Add(const Scored& s, const Scored& exact, const std::vector<int32_t>& w, uint32_t N) {
    for (size_t i = 0; i < s.logp.size(); ++i) {
      const auto& lp = s.logp[i];
      const auto& le = exact.logp[i];
      nll -= lp[static_cast<size_t>(w[N + 1 + i])];
      kl += KLDivergence(le, lp);
      top1 += ArgMax(lp) == ArgMax(le);
      ++scored;
    }
    for (size_t g = 0; g < s.greedy.size(); ++g) greedy += s.greedy[g] == exact.greedy[g];
    greedy_n += s.greedy.size();
    ++windows;
  }
};

struct RowSpec {
  std::string codec, setting;
  std::string engine_type;  // llama-q8_0 -> "q8_0"
  CodecConfig cfg;
  uint32_t level = 0;  // decoded level (cfg.levels > 1)
};

// Bytes a load of one level moves: the whole container when it has one level
// (headers included), else that level's frames.
uint64_t LevelBytes(const ContainerInfo& info, uint32_t level, uint64_t container_bytes) {
  if (info.levels <= 1) return container_bytes;
  uint64_t n = 0;
  for (const ChunkEntry& c : info.chunks) n += c.frame_size[level];
  return n;
}

}  // namespace

Status TeacherForcedLogProbs(LlamaContext& ctx, std::span<const int32_t> w, uint32_t N, uint32_t M,
                             std::vector<std::vector<float>>* logp) {
  CG_RETURN_IF_ERROR(ctx.Eval(w.subspan(N, M), static_cast<int32_t>(N), 0, true));
  logp->resize(M);
  for (uint32_t i = 0; i < M; ++i) LogSoftmax(ctx.Logits(i), (*logp)[i]);
  return Status::Ok();
}

double KLDivergence(std::span<const float> exact_logp, std::span<const float> logp) {
  double k = 0;
  for (size_t v = 0; v < logp.size(); ++v)
    k += std::exp(double{exact_logp[v]}) * (double{exact_logp[v]} - logp[v]);
  return std::max(0.0, k);
}

std::vector<std::vector<int32_t>> MakeWindows(const LlamaModel& model, const std::string& text, uint32_t length,
                                              uint32_t max) {
  std::vector<int32_t> stream;
  std::vector<size_t> starts;
  for (const std::string& story : SplitStories(text)) {
    auto toks = model.Tokenize(story);
    if (!toks.ok()) continue;
    starts.push_back(stream.size());
    if (model.info().bos >= 0) stream.push_back(model.info().bos);
    stream.insert(stream.end(), toks->begin(), toks->end());
  }
  if (starts.size() <= 1) {  // one long text: cut it anywhere
    starts.clear();
    for (size_t s = 0; s < stream.size(); s += length) starts.push_back(s);
  }
  std::vector<std::vector<int32_t>> out;
  size_t next_free = 0;
  for (size_t s : starts) {
    if (out.size() >= max) break;
    if (s < next_free || s + length > stream.size()) continue;
    out.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(s),
                     stream.begin() + static_cast<std::ptrdiff_t>(s + length));
    next_free = s + length;
  }
  return out;
}

Result<EvalReport> RunEval(const EvalOptions& o) {
  const auto say = [&](const std::string& m) {
    if (o.progress) o.progress(m);
  };
  if (o.context == 0 || o.continuation == 0) return Status::InvalidArgument("context and continuation must be > 0");
  CG_ASSIGN_OR_RETURN(auto model, LlamaModel::Load(o.model_path));
  const LlamaModelInfo& info = model->info();
  const uint32_t N = o.context, M = o.continuation, G = o.greedy;
  const uint32_t n_ctx = N + std::max(M, G) + 8;

  // Rows to run, in order.
  std::vector<RowSpec> specs;
  std::vector<EvalSkip> skipped;
  const std::vector<std::string> names = CodecNames();
  for (const std::string& c : o.codecs) {
    if (c.starts_with("llama-")) {
      const Result<int32_t> type = GgmlCacheTypeByName(c.substr(6));
      if (!type.ok() || !FindGgmlCacheType(*type)->quantized()) {
        return Status::InvalidArgument("unknown engine cache type '" + c + "' for eval (llama-q8_0, llama-q4_0, ...)");
      }
      specs.push_back({c, "engine cache type", c.substr(6), {}});
      continue;
    }
    const std::string& codec = c;
    if (std::find(names.begin(), names.end(), codec) == names.end()) {
      return Status::InvalidArgument("unknown codec '" + c + "' for eval");
    }
    CodecConfig cfg = o.codec;
    cfg.codec = codec;
    cfg.rope = o.rope ? CodecRope(info) : RopeConfig{};
    cfg.threads = 1;
    cfg.bits_per_value = 0;
    if (codec == "cachegen") {
      if (o.bits.empty() && o.max_kl.empty()) return Status::InvalidArgument("no --bits or --max-kl for " + c);
      cfg.levels = std::max(1u, o.levels);
      const std::string suffix = fmt::format("{}{}{}", o.rope ? "" : " no-rope", o.codec.profile ? " profile" : "",
                                             o.codec.quantizer == CodecConfig::Quantizer::kLloyd ? " lloyd" : "");
      auto add_rows = [&](const CodecConfig& rate, const std::string& setting) {
        for (uint32_t level = 0; level < rate.levels; ++level)
          specs.push_back(
              {c, rate.levels > 1 ? fmt::format("{} level={}", setting, level) : setting, "", rate, level});
      };
      for (double b : o.bits) {
        cfg.bits_per_value = b;
        add_rows(cfg, fmt::format("bits={:g}{}", b, suffix));
      }
      cfg.bits_per_value = 0;
      for (double k : o.max_kl) {
        cfg.max_kl = k;
        add_rows(cfg, fmt::format("max-kl={:g}{}", k, suffix));
      }
    } else {
      cfg.profile = nullptr;  // a model profile is the cachegen codec's; baselines run as they are
      specs.push_back({c, "default", "", cfg});
    }
  }

  LlamaContextOptions co;
  co.n_ctx = n_ctx;
  co.cache = o.cache;
  co.model_basis = true;  // a rotated cache's KV coded in the model's basis, as llama-serve codes it
  co.flash_attn = o.flash_attn;
  co.threads = o.threads;
  CG_ASSIGN_OR_RETURN(auto ref, LlamaContext::Create(model, co));
  CG_ASSIGN_OR_RETURN(auto dst, LlamaContext::Create(model, co));
  // Engine-quantized contexts; a type the model cannot run is reported, not fatal.
  std::vector<RowSpec> kept;
  std::vector<std::unique_ptr<LlamaContext>> kept_ctx;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].engine_type.empty()) {
      LlamaContextOptions qo = co;
      qo.cache = {specs[i].engine_type, specs[i].engine_type};
      qo.flash_attn = 1;  // llama.cpp needs flash attention for a quantized V cache
      auto q = LlamaContext::Create(model, qo);
      if (!q.ok()) {
        skipped.push_back({specs[i].codec, q.status().message() +
                                               " (llama.cpp's block-32 types need a head dim that is a multiple of 32)"});
        continue;
      }
      kept_ctx.push_back(std::move(q).value());
    } else {
      kept_ctx.push_back(nullptr);
    }
    kept.push_back(specs[i]);
  }
  specs = std::move(kept);

  const auto windows = MakeWindows(*model, o.text, N + M + 1, o.windows);
  if (windows.empty()) {
    return Status::InvalidArgument(fmt::format("the text has no window of {} tokens starting at a story start",
                                               N + M + 1));
  }

  EvalReport rep;
  rep.model = o.model_path;
  rep.info = info;
  rep.windows = static_cast<uint32_t>(windows.size());
  rep.context = N;
  rep.continuation = M;
  rep.greedy = G;
  rep.skipped = std::move(skipped);
  std::vector<Accum> acc(specs.size());
  std::vector<std::string> samples(specs.size());
  Accum exact_acc;
  const auto t0 = Clock::now();
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const auto& w = windows[wi];
    ref->Clear();
    CG_RETURN_IF_ERROR(ref->Eval(std::span<const int32_t>(w).first(N), 0));
    CG_ASSIGN_OR_RETURN(CapturedKV cap, ref->Capture(0));
    const uint64_t values = cap.kv.shape().values();

    Scored exact;
    CG_RETURN_IF_ERROR(dst->Inject(0, cap.kv.view(), cap.positions));
    CG_RETURN_IF_ERROR(Score(*dst, w, N, M, G, &exact));
    exact_acc.Add(exact, exact, w, N);
    if (wi == 0) {
      rep.sample_exact = model->Detokenize(exact.greedy);
      const uint32_t lead = std::min(N, 16u);
      rep.sample_lead = model->Detokenize(std::span<const int32_t>(w).subspan(N - lead + 1, lead));
    }

    std::vector<uint8_t> bytes;  // the container of the current rate
    EncodeStats stats;           // and what its encoder reported
    double encode_s = 0;
    for (size_t r = 0; r < specs.size(); ++r) {
      const RowSpec& sp = specs[r];
      Scored got;
      if (kept_ctx[r]) {
        LlamaContext& q = *kept_ctx[r];
        q.Clear();
        CG_RETURN_IF_ERROR(q.Eval(std::span<const int32_t>(w).first(N), 0));
        CG_RETURN_IF_ERROR(Score(q, w, N, M, G, &got));
        const GgmlCacheType* t = FindGgmlCacheType(*GgmlCacheTypeByName(sp.engine_type));
        acc[r].bits += 8.0 * t->block_bytes / t->block;  // q8_0: 34 bytes per 32 values, 8.5 bits
      } else {
        // The rows of one rate's levels follow each other (level 0 first)
        // and share one multi-level container: encoded once, at level 0.
        if (sp.level == 0) {
          CodecConfig cfg = sp.cfg;
          if (!PositionsFrom(cap.positions, 0)) cfg.rope = RopeConfig{};  // the codec puts token t at position t
          CG_ASSIGN_OR_RETURN(auto enc, Encoder::Create(cfg));
          auto te = Clock::now();
          CG_ASSIGN_OR_RETURN(bytes, enc.Encode(cap.kv.view(), &stats));
          encode_s = Since(te);
        }
        acc[r].encode_s += encode_s;
        const double predicted = sp.level < stats.level_predicted_kl.size() ? stats.level_predicted_kl[sp.level] : -1;
        acc[r].predicted_kl = acc[r].predicted_kl < 0 || predicted < 0 ? -1 : acc[r].predicted_kl + predicted;
        const auto td = Clock::now();
        const ProfileSet profiles(sp.cfg.profile);
        CG_ASSIGN_OR_RETURN(auto dec, Decoder::Open(bytes, &profiles));
        CG_ASSIGN_OR_RETURN(KVTensor out, dec.Decode(cap.kv.dtype(), sp.level));
        acc[r].decode_s += Since(td);
        acc[r].bits += static_cast<double>(LevelBytes(dec.info(), sp.level, bytes.size())) * 8.0 /
                       static_cast<double>(values);
        CG_RETURN_IF_ERROR(dst->Inject(0, out.view(), cap.positions));
        CG_RETURN_IF_ERROR(Score(*dst, w, N, M, G, &got));
      }
      acc[r].Add(got, exact, w, N);
      if (wi == 0) samples[r] = model->Detokenize(got.greedy);
    }
    say(fmt::format("window {}/{} done ({:.1f} s)", wi + 1, windows.size(), Since(t0)));
  }

  rep.ppl_exact = std::exp(exact_acc.nll / static_cast<double>(exact_acc.scored));
  for (size_t r = 0; r < specs.size(); ++r) {
    const Accum& a = acc[r];
    EvalRow row;
    row.codec = specs[r].codec;
    row.setting = specs[r].setting;
    row.level = specs[r].level;
    row.bits_per_value = a.bits / static_cast<double>(a.windows);
    row.ratio_vs_fp16 = 16.0 / row.bits_per_value;
    row.ppl = std::exp(a.nll / static_cast<double>(a.scored));
    row.delta_ppl_pct = (row.ppl / rep.ppl_exact - 1.0) * 100.0;
    row.kl = a.kl / static_cast<double>(a.scored);
    row.top1_agreement = a.top1 / static_cast<double>(a.scored);
    row.greedy_match = a.greedy_n ? a.greedy / static_cast<double>(a.greedy_n) : 1.0;
    row.predicted_kl = specs[r].engine_type.empty() && specs[r].cfg.codec == "cachegen" && a.predicted_kl >= 0
                           ? a.predicted_kl / static_cast<double>(a.windows)
                           : -1;
    row.encode_s = a.encode_s;
    row.decode_s = a.decode_s;
    row.sample = std::move(samples[r]);
    rep.rows.push_back(row);
  }
  return rep;
}

}  // namespace cachegen::engine
