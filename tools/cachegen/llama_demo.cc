// `cachegen demo` with llama.cpp: the whole point on one screen. A trained
// model (stories260K by default) prefills a context exactly; its KV is
// compressed by the default codec, restored into a fresh context, and the
// model itself says what that cost: size ratio, ΔPPL of the continuation,
// and the first sentence it generates with the exact and the restored KV.
// Then the same with a model profile, learned first from other windows of
// the text (or given).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cachegen/cli.h"
#include "cachegen/llama_defaults.h"
#include "cachegen/profile.h"
#include "engine/llama/eval.h"

namespace cachegen::cli {
namespace {

std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// Up to the first sentence end, as one line.
std::string FirstSentence(const std::string& text) {
  std::string s;
  for (char c : OneLine(text)) {
    s += c;
    if ((c == '.' || c == '!' || c == '?') && s.find_first_not_of(" .!?") != std::string::npos) return s;
  }
  return s + " ...";
}

// The size, quality and speed of one eval row, and the first sentence the
// model generates with the exact and with the restored KV.
void PrintRow(const engine::EvalReport& rep, const engine::EvalRow& r, const char* side_information) {
  std::printf("  size      %.3f bits/value, %s: %.2fx smaller than f16\n", r.bits_per_value, side_information,
              r.ratio_vs_fp16);
  std::printf("  quality   perplexity %.4f with the exact KV, %.4f restored: dPPL %+.2f %%; mean KL %.2e, "
              "top-1 agreement %.1f %%\n",
              rep.ppl_exact, r.ppl, r.delta_ppl_pct, r.kl, 100 * r.top1_agreement);
  std::printf("  speed     encode %.1f ms, decode %.1f ms per context of %u tokens\n",
              1e3 * r.encode_s / rep.windows, 1e3 * r.decode_s / rep.windows, rep.context);
  std::printf("\n  first window, the context ends \"...%s\"; the model goes on:\n", OneLine(rep.sample_lead).c_str());
  std::printf("    exact KV:    %s\n", FirstSentence(rep.sample_exact).c_str());
  std::printf("    restored KV: %s\n", FirstSentence(r.sample).c_str());
}

int RunModelDemo(const ModelDemoArgs& args) {
  // A profile given is read first: a bad file fails before any work.
  std::shared_ptr<const Profile> given;
  if (!args.profile.empty()) {
    Result<std::shared_ptr<const Profile>> p = LoadProfileFile(args.profile);
    if (!p.ok()) return Fail(p.status());
    given = *p;
  }
  engine::EvalOptions o;
  std::string note;
  o.model_path = args.model;
  if (o.model_path.empty()) {
    Result<std::string> path = DefaultModelPath("demo", &note);
    if (!path.ok()) return Fail(path.status());
    o.model_path = *path;
  }
  Result<std::string> text = TextOrDefault("demo", args.text);
  if (!text.ok()) return Fail(text.status());
  o.text = std::move(*text);
  o.codecs = {"cachegen"};
  o.bits = {kDefaultBitsPerValue};
  o.windows = args.windows;
  o.cache = args.cache;
  o.greedy = 48;  // enough tokens for a sentence of a TinyStories model
  Result<engine::EvalReport> rep = engine::RunEval(o);
  if (!rep.ok()) return Fail(rep.status());
  const engine::EvalRow& r = rep->rows.at(0);
  const LlamaModelInfo& in = rep->info;
  std::printf(
      "cachegen demo: %s (%u layers, %u KV heads x %u dims), %u text windows\n"
      "Each window's first %u tokens are prefilled exactly; their KV (llama.cpp %s cache) is compressed with\n"
      "the default codec (cachegen, %.3g bits/value target, RoPE-aware keys), decoded, and injected into a fresh\n"
      "context, which then scores the next %u tokens and generates greedily.\n\n",
      std::filesystem::path(rep->model).filename().c_str(), in.layers, in.kv_heads, in.head_dim, rep->windows,
      rep->context, args.cache.ToString().c_str(),
      kDefaultBitsPerValue, rep->continuation);
  if (!note.empty()) std::printf("note: %s\n\n", note.c_str());
  PrintRow(*rep, r, "all side information included");
  if (!args.learn_profile && args.profile.empty()) return 0;

  std::fflush(stdout);
  std::string how = "read from " + args.profile;
  if (given) {
    o.codec.profile = given;
  } else {
    Result<engine::AutoProfile> p = AutoProfileFor("demo", o.model_path, 0, false, args.cache);
    if (!p.ok()) {
      std::fprintf(stderr, "cachegen demo: no profile run: %s\n", p.status().message().c_str());
      return 0;
    }
    o.codec.profile = p->profile;
    how = "the model's automatic profile, " + p->source;
  }
  o.codec.quantizer = o.codec.profile->quantizer().value_or(o.codec.quantizer);
  Result<engine::EvalReport> with = engine::RunEval(o);
  if (!with.ok()) return Fail(with.status());
  std::printf(
      "\nThe same with a model profile: channel statistics, key transforms and entropy tables of this model\n"
      "(`cachegen profile train`; %zu KB, stored once per model, frames reference it by id),\n%s.\n\n",
      o.codec.profile->bytes().size() / 1024, how.c_str());
  PrintRow(*with, with->rows.at(0), "frames only (the profile is stored once per model)");
  return 0;
}

const bool kRegistered = (SetModelDemo(RunModelDemo), true);

}  // namespace
}  // namespace cachegen::cli
