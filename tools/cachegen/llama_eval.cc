// `cachegen eval`: rate–quality of every codec on a real model's own KV cache
// (engine/llama/eval.h), as a table, JSON, and a gnuplot PNG.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "engine/llama/eval.h"
#include "engine/llama/ggml_quantizer.h"

namespace cachegen::cli {
namespace {

constexpr const char* kDefaultCodecs = "cachegen,cachegen-ref,fp16,q8,q4,kivi2,kivi4,llama-q8_0,llama-q4_0";

struct EvalArgs {
  std::string model, text, codecs = kDefaultCodecs, bits = "1,1.5,2,3,4", max_kl;
  uint32_t context = 384, continuation = 128, windows = 16, greedy = 32, threads = 0, levels = 1;
  LlamaCacheTypes cache;
  int flash_attn = -1;
  bool json = false, quiet = false, rope = true;
  std::string plot, profile;
  CodecConfig tuning;
  bool quantizer_given = false;
};

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read text '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status Plot(const engine::EvalReport& rep, const std::string& png) {
  const std::string dir = std::filesystem::temp_directory_path() / ("cachegen_plot_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::map<std::string, std::vector<const engine::EvalRow*>> by_codec;
  for (const auto& r : rep.rows) by_codec[r.codec].push_back(&r);
  std::string script = fmt::format(
      "set terminal pngcairo size 1000,650\nset output '{}'\nset title \"{} ({} windows, context {} + {})\"\n"
      "set xlabel 'bits per value (all side information)'\nset ylabel 'ΔPPL %% vs exact KV (log scale: 0.001 or less, negative too, drawn at 0.001)'\n"
      "set logscale y\nset grid\nset key outside right\nplot ",
      png, std::filesystem::path(rep.model).filename().string(), rep.windows, rep.context, rep.continuation);
  bool first = true;
  for (const auto& [codec, rows] : by_codec) {
    const std::string data = dir + "/" + codec + ".dat";
    std::ofstream f(data);
    for (const auto* r : rows) f << r->bits_per_value << " " << std::max(r->delta_ppl_pct, 1e-3) << "\n";
    script += fmt::format("{}'{}' using 1:2 with linespoints title '{}'", first ? "" : ", ", data, codec);
    first = false;
  }
  script += "\n";
  const std::string gp = dir + "/plot.gp";
  std::ofstream(gp) << script;
  const int rc = std::system(("gnuplot '" + gp + "' 2>" + dir + "/gnuplot.err").c_str());
  std::string err;
  if (rc != 0) {
    auto e = ReadText(dir + "/gnuplot.err");
    err = e.ok() ? *e : "";
  }
  std::filesystem::remove_all(dir);
  if (rc != 0) return Status::IOError("gnuplot failed (is gnuplot installed?): " + err);
  return Status::Ok();
}

// A comma list of rate targets, each a number in (0, max].
Result<std::vector<double>> RateList(const std::string& list, const std::string& option, double max) {
  std::vector<double> out;
  for (const auto& item : SplitList(list)) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end || !(v > 0) || v > max)
      return Status::InvalidArgument("bad " + option + " value '" + item + "'");
    out.push_back(v);
  }
  return out;
}

nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

int RunEval(EvalArgs a) {
  engine::EvalOptions o;
  std::string note;
  if (a.model.empty()) {
    Result<std::string> path = DefaultModelPath("eval", &note);
    if (!path.ok()) return Fail(path.status());
    a.model = *path;
  }
  std::string text_source;
  Result<std::string> text = TextOrDefault("eval", a.text, &text_source);
  if (!text.ok()) return Fail(text.status());
  o.text = std::move(*text);
  o.model_path = a.model;
  o.codecs = SplitList(a.codecs);
  Result<std::vector<double>> bits = RateList(a.bits, "--bits", 32);
  if (!bits.ok()) return Fail(bits.status());
  o.bits = std::move(*bits);
  Result<std::vector<double>> max_kl = RateList(a.max_kl, "--max-kl", 100);
  if (!max_kl.ok()) return Fail(max_kl.status());
  o.max_kl = std::move(*max_kl);
  o.context = a.context;
  o.continuation = a.continuation;
  o.windows = a.windows;
  o.levels = a.levels;
  o.greedy = a.greedy;
  o.cache = a.cache;
  o.flash_attn = a.flash_attn;
  o.threads = a.threads;
  o.codec = a.tuning;
  o.rope = a.rope;
  std::string profile_source = "none (--profile none)";
  if (a.profile.empty()) {
    Result<engine::AutoProfile> ap = AutoProfileFor("eval", a.model, a.threads, a.quiet, a.cache);
    if (!ap.ok()) return Fail(ap.status());
    o.codec.profile = ap->profile;
    if (!a.quantizer_given) o.codec.quantizer = ap->profile->quantizer().value_or(o.codec.quantizer);
    profile_source = "automatic: " + ap->source;
  } else if (a.profile != "none") {
    if (Status st = UseProfileFile(a.profile, a.quantizer_given, &o.codec); !st.ok()) return Fail(st);
    profile_source = a.profile;
  }
  if (!o.max_kl.empty() && (!o.codec.profile || o.codec.profile->data().sensitivity.empty()))
    return Fail(Status::InvalidArgument(
        "--max-kl needs --profile P.cgprof with measured sensitivities (cachegen profile train measures them)"));
  if (!a.quiet) o.progress = [](const std::string& m) { std::fprintf(stderr, "cachegen eval: %s\n", m.c_str()); };
  auto rep = engine::RunEval(o);
  if (!rep.ok()) return Fail(rep.status());

  if (!a.plot.empty()) {
    Status st = Plot(*rep, a.plot);
    if (!st.ok()) return Fail(st);
  }
  if (a.json) {
    nlohmann::json j;
    j["model"] = rep->model;
    if (!note.empty()) j["note"] = note;
    j["text"] = text_source;
    j["profile"] = profile_source;
    j["windows"] = rep->windows;
    j["context"] = rep->context;
    j["continuation"] = rep->continuation;
    j["greedy"] = rep->greedy;
    j["cache_type_k"] = a.cache.k;
    j["cache_type_v"] = a.cache.v;
    j["ppl_exact"] = Num(rep->ppl_exact);
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rep->rows) {
      j["rows"].push_back({{"codec", r.codec},
                           {"setting", r.setting},
                           {"bits_per_value", Num(r.bits_per_value)},
                           {"ratio_vs_fp16", Num(r.ratio_vs_fp16)},
                           {"ppl", Num(r.ppl)},
                           {"delta_ppl_pct", Num(r.delta_ppl_pct)},
                           {"kl", Num(r.kl)},
                           {"predicted_kl", r.predicted_kl >= 0 ? Num(r.predicted_kl) : nlohmann::json(nullptr)},
                           {"top1_agreement", Num(r.top1_agreement)},
                           {"greedy_match", Num(r.greedy_match)},
                           {"encode_s", Num(r.encode_s)},
                           {"decode_s", Num(r.decode_s)}});
    }
    j["skipped"] = nlohmann::json::array();
    for (const auto& s : rep->skipped) j["skipped"].push_back({{"codec", s.codec}, {"reason", s.reason}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (!a.quiet) std::fprintf(stderr, "cachegen eval: profile %s\n", profile_source.c_str());
  const auto& in = rep->info;
  std::printf("model %s: %u layers, %u KV heads x %u dims; %u windows of %u context + %u scored tokens; "
              "exact-KV perplexity %.4f\n",
              rep->model.c_str(), in.layers, in.kv_heads, in.head_dim, rep->windows, rep->context,
              rep->continuation, rep->ppl_exact);
  std::printf("%-14s %-18s %8s %7s %9s %8s %10s %10s %6s %7s\n", "codec", "setting", "bits/val", "ratio", "ppl",
              "dPPL %", "mean KL", "pred. KL", "top-1", "greedy");
  for (const auto& r : rep->rows) {
    const std::string predicted = r.predicted_kl >= 0 ? fmt::format("{:10.2e}", r.predicted_kl) : fmt::format("{:>10}", "-");
    std::printf("%-14s %-18s %8.3f %6.2fx %9.4f %8.3f %10.2e %s %6.3f %7.3f\n", r.codec.c_str(), r.setting.c_str(),
                r.bits_per_value, r.ratio_vs_fp16, r.ppl, r.delta_ppl_pct, r.kl, predicted.c_str(), r.top1_agreement,
                r.greedy_match);
  }
  for (const auto& s : rep->skipped) std::printf("skipped %s: %s\n", s.codec.c_str(), s.reason.c_str());
  std::printf("greedy continuation, exact KV: %s\n", rep->sample_exact.c_str());
  return 0;
}

const bool kRegistered = RegisterCommand(50, [](CLI::App& root) -> CommandRunner {
  // Lets encode and slot compress read RoPE parameters from --model.
  SetModelReader([](const std::string& gguf) -> Result<ModelKeyFacts> {
    CG_ASSIGN_OR_RETURN(auto model, LlamaModel::Load(gguf));
    return ModelKeyFacts{CodecRope(model->info()), model->info().kv_heads};
  });
  // Lets slot compress and restore handle slots of quantized caches.
  SetBlockQuantizer(&engine::LlamaGgmlQuantizer());
  // Lets slot compress --model learn or read the model's automatic profile.
  SetModelProfiler([](const std::string& gguf) -> Result<ModelProfileFacts> {
    CG_ASSIGN_OR_RETURN(engine::AutoProfile p, AutoProfileFor("slot compress", gguf, 0, false));
    return ModelProfileFacts{p.profile, p.source};
  });
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = root.add_subcommand(
      "eval", "Rate-quality of every codec on a llama.cpp model's own KV cache (PPL, KL, top-1, greedy match)");
  sub->add_option("--model", a->model,
                  std::string("GGUF model (default: ") + kSharedModel + ", else a generated random-weight model)");
  sub->add_option("--text", a->text, std::string("Text, stories separated by <|endoftext|> lines (default: ") +
                                         kSharedText + ")");
  sub->add_option("--codecs", a->codecs,
                  "Codecs: cachegen, cachegen-ref, fp16, "
                  "fp16-zstd, q8, q4, kivi2, kivi4, llama-TYPE (llama.cpp's own cache type TYPE: q8_0, q4_0, "
                  "q4_1, q5_0, q5_1, iq4_nl)")
      ->capture_default_str();
  sub->add_option("--bits", a->bits, "Rates (bits/value) for cachegen")->capture_default_str();
  sub->add_option("--max-kl", a->max_kl,
                  "KL targets for cachegen (comma list): a row each, steps from the --profile's sensitivities");
  sub->add_option("--levels", a->levels,
                  "cachegen quality levels per chunk (as stored for streaming); > 1: a row per level")
      ->capture_default_str()
      ->check(CLI::Range(1, 8));
  sub->add_flag("--rope,!--no-rope", a->rope,
                "cachegen: undo the model's RoPE on keys before coding, redo it on decode (default on)")
      ->capture_default_str();
  sub->add_option("--context", a->context, "Context tokens prefilled and compressed")->capture_default_str();
  sub->add_option("--continuation", a->continuation, "Tokens scored after the context")->capture_default_str();
  sub->add_option("--windows", a->windows, "Maximum number of text windows")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_option("--greedy", a->greedy, "Greedy tokens compared with the exact-KV generation")
      ->capture_default_str();
  AddCacheTypeOptions(sub, &a->cache, "the exact context, which decoded KV is injected into");
  sub->add_option("--flash-attn", a->flash_attn, "-1 auto, 0 off, 1 on")->capture_default_str();
  sub->add_option("--threads", a->threads, "llama.cpp threads (0: 1 for tiny models, else up to 4)")
      ->capture_default_str();
  sub->add_option("--chunk-tokens", a->tuning.chunk_tokens, "Codec chunk size in tokens")->capture_default_str();
  sub->add_option("--group-tokens", a->tuning.group_tokens, "cachegen: prediction group size G (0 = default)");
  sub->add_flag("--rotate,!--no-rotate", a->tuning.rotate, "cachegen: per-head Hadamard rotation (default off)");
  sub->add_option("--layer-slope", a->tuning.layer_slope, "cachegen: >0 gives shallow layers finer steps");
  sub->add_option("--key-step-scale", a->tuning.key_step_scale, "cachegen: K step relative to V (bits mode)");
  AddQuantizerOption(sub, &a->tuning, &a->quantizer_given);
  sub->add_option("--recent-tokens", a->tuning.recent_tokens, "cachegen: most recent W tokens at finer precision");
  sub->add_option("--recent-step-scale", a->tuning.recent_step_scale, "cachegen: their step multiplier")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--profile", a->profile,
                  "cachegen: encode with this model profile (.cgprof); none: without one; default: the model's "
                  "automatic profile (learned once from text the model writes itself, then read from the cache)");
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_option("--plot", a->plot, "Write the bits/value vs ΔPPL curves as a PNG (gnuplot)");
  sub->add_flag("-q,--quiet", a->quiet, "No progress on stderr");
  return [sub, a] { return *sub ? std::optional<int>(RunEval(*a)) : std::nullopt; };
});

}  // namespace
}  // namespace cachegen::cli
