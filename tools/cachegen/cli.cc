#include "cachegen/cli.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cachegen/profile.h"
#include "codec/cachegen/profile_cache.h"
#include "kv/io.h"
#include "engine/llama_state.h"
#include "kv/synthetic.h"
#include "store/uri.h"

namespace cachegen::cli {

Result<uint64_t> ParseByteSize(const std::string& text, const std::string& what) {
  // Through the store URI parser: one size syntax for the whole tool.
  Result<store::StoreUri> uri = store::ParseStoreUri("mem://?size=" + text);
  Result<uint64_t> size = uri.ok() ? uri->TakeSize("size", 0) : Result<uint64_t>(uri.status());
  if (!size.ok() || text.empty()) {
    return Status::InvalidArgument(what + ": '" + text + "' is not a size (bytes, or with K, M, G or T)");
  }
  return size;
}

std::vector<CLI::Option*> AddCacheTypeOptions(CLI::App* sub, LlamaCacheTypes* types, const std::string& what) {
  const std::string names = engine::GgmlCacheTypeNames();
  // CLI11 runs option callbacks in the order the options are added: -k and -v override.
  return {sub->add_option_function<std::string>(
      "--cache-type", [types](const std::string& t) { types->k = types->v = t; },
      "llama.cpp K and V cache type of " + what + ": " + names + " (default f16; a quantized V turns flash attention on)"),
          sub->add_option("--cache-type-k", types->k, "K cache type (overrides --cache-type)"),
          sub->add_option("--cache-type-v", types->v, "V cache type (overrides --cache-type)")};
}

namespace {
std::function<Result<ModelKeyFacts>(const std::string&)>& ModelReader() {
  static std::function<Result<ModelKeyFacts>(const std::string&)> reader;
  return reader;
}
std::function<int(const ModelDemoArgs&)>& ModelDemoSlot() {
  static std::function<int(const ModelDemoArgs&)> demo;
  return demo;
}
}  // namespace

void SetModelReader(std::function<Result<ModelKeyFacts>(const std::string&)> reader) {
  ModelReader() = std::move(reader);
}

const std::function<int(const ModelDemoArgs&)>& ModelDemo() { return ModelDemoSlot(); }

void SetModelDemo(std::function<int(const ModelDemoArgs&)> demo) { ModelDemoSlot() = std::move(demo); }

std::function<Result<ModelProfileFacts>(const std::string&)>& ModelProfiler() {
  static std::function<Result<ModelProfileFacts>(const std::string&)> f;
  return f;
}

void SetModelProfiler(std::function<Result<ModelProfileFacts>(const std::string&)> profiler) {
  ModelProfiler() = std::move(profiler);
}

namespace {
const engine::GgmlQuantizer*& BlockQuantizerSlot() {
  static const engine::GgmlQuantizer* q = nullptr;
  return q;
}
}  // namespace

void SetBlockQuantizer(const engine::GgmlQuantizer* quantizer) { BlockQuantizerSlot() = quantizer; }
const engine::GgmlQuantizer* BlockQuantizer() { return BlockQuantizerSlot(); }

Result<ModelProfileFacts> AutomaticModelProfile(const std::string& gguf) {
  if (!ModelProfiler()) return Status::Unsupported("an automatic profile needs a build with llama.cpp");
  return ModelProfiler()(gguf);
}

Result<std::shared_ptr<const ProfileSet>> DecodeProfiles(const std::string& profile_path) {
  auto profiles = std::make_shared<ProfileSet>();
  if (profile_path.empty()) {
    AddCachedProfiles(DefaultProfileCacheDir(), *profiles);
  } else {
    CG_ASSIGN_OR_RETURN(std::shared_ptr<const Profile> p, LoadProfileFile(profile_path));
    profiles->Add(std::move(p));
  }
  return std::shared_ptr<const ProfileSet>(std::move(profiles));
}

Result<ModelKeyFacts> ReadModelKeyFacts(const std::string& gguf) {
  if (!ModelReader()) return Status::Unsupported("--model needs a build with llama.cpp (or give --rope ...)");
  return ModelReader()(gguf);
}

void AddRopeOptions(CLI::App* app, RopeArgs* a, bool model_flag) {
  app->add_option("--rope", a->kind,
                  "cachegen: keys are post-RoPE of this kind (none, normal, neox): RoPE is undone before coding and "
                  "redone on decode (key of token t at position token_start + t)")
      ->check(CLI::IsMember({"none", "normal", "neox"}));
  app->add_option("--rope-dims", a->dims, "cachegen: rotated dims per head (0 = head dim)")->capture_default_str();
  app->add_option("--rope-theta", a->theta, "cachegen: RoPE frequency base")->capture_default_str();
  app->add_option("--rope-scale", a->scale, "cachegen: RoPE frequency scale")->capture_default_str();
  if (model_flag) {
    app->add_option("--model", a->model, "GGUF model whose RoPE parameters are used (RoPE handling on)");
    app->add_flag("--no-rope", a->off, "Code keys as they are (post-RoPE) even with --model");
  }
}

void AddQuantizerOption(CLI::App* app, CodecConfig* config, bool* given) {
  // A string option rather than CLI11's enum mapping, which prints the enum's
  // char-sized values as raw bytes in --help and in its error message.
  app->add_option_function<std::string>(
         "--quantizer",
         [config, given](const std::string& name) {
           config->quantizer = name == "lloyd" ? CodecConfig::Quantizer::kLloyd : CodecConfig::Quantizer::kUniform;
           if (given) *given = true;
         },
         "cachegen: uniform (levels at multiples of the step) or lloyd (learned reconstruction codebook per "
         "section, rate-constrained choice of levels)" +
             std::string(given ? "; default: the --profile's, else uniform" : ""))
      ->check(CLI::IsMember({"uniform", "lloyd"}))
      ->default_str(config->quantizer == CodecConfig::Quantizer::kLloyd ? "lloyd" : "uniform");
}

Result<std::shared_ptr<const Profile>> LoadProfileFile(const std::string& path) {
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  auto p = Profile::Parse(bytes);
  if (!p.ok()) return p.status().code() == StatusCode::kUnsupported
                         ? Status::Unsupported("'" + path + "': " + p.status().message())
                         : Status::Corrupt("'" + path + "': " + p.status().message());
  return p;
}

Status UseProfileFile(const std::string& path, bool quantizer_given, CodecConfig* config) {
  CG_ASSIGN_OR_RETURN(config->profile, LoadProfileFile(path));
  if (!quantizer_given) config->quantizer = config->profile->quantizer().value_or(config->quantizer);
  return Status::Ok();
}

namespace {
CLI::Validator NumberAtLeast(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v)) return "'" + text + "' is not a finite number";
        if (v > 0 || (zero_allowed && v == 0)) return "";
        return "must be " + std::string(zero_allowed ? ">= 0" : "> 0") + ", got " + text;
      },
      zero_allowed ? "NUMBER>=0" : "NUMBER>0");
}
}  // namespace

CLI::Validator Positive() { return NumberAtLeast(false); }
CLI::Validator NonNegative() { return NumberAtLeast(true); }

CLI::Validator FileExtension(const std::string& extension, const std::string& why) {
  return CLI::Validator(
      [extension, why](std::string& path) -> std::string {
        if (path.size() > extension.size() && path.ends_with(extension)) return "";
        return "'" + path + "' must end in " + extension + " (" + why + ")";
      },
      "PATH" + extension);
}

void NoteSectionsUnlikeProfile(uint64_t unlike, uint64_t sections) {
  if (unlike == 0) return;
  std::fprintf(stderr,
               "cachegen: note: %llu of %llu sections were coded with their own statistics, not the profile's: their "
               "data is far from the profile's training data (is it this model's profile?)\n",
               static_cast<unsigned long long>(unlike), static_cast<unsigned long long>(sections));
}

bool PredictsKl(const EncodeStats& stats) {
  return !stats.level_predicted_kl.empty() &&
         std::all_of(stats.level_predicted_kl.begin(), stats.level_predicted_kl.end(), [](double k) { return k >= 0; });
}

Result<RopeConfig> ResolveRope(const RopeArgs& a) {
  RopeConfig r;
  if (!a.kind.empty()) {
    if (a.kind == "none") return r;
    r.kind = a.kind == "neox" ? RopeConfig::Kind::kNeox : RopeConfig::Kind::kNormal;
    r.dims = a.dims;
    r.freq_base = a.theta;
    r.freq_scale = a.scale;
    return r;
  }
  if (a.off) return r;
  if (!a.model.empty()) {
    Result<ModelKeyFacts> m = ReadModelKeyFacts(a.model);
    if (!m.ok()) return m.status();
    return m->rope;
  }
  if (!a.input.ends_with(".safetensors")) return r;
  Result<KVMetadata> meta = ReadSafetensorsMetadata(a.input);
  if (!meta.ok() || !meta->contains("rope")) return r;  // not captured (reading the KV reports a bad file)
  return RopeFromMetadata(*meta);
}

Result<RopeConfig> RopeFromMetadata(const KVMetadata& m) {
  RopeConfig r;
  const std::string kind = m.at("rope");
  if (kind == "none") return r;
  if (kind != "normal" && kind != "neox") return Status::InvalidArgument("capture metadata: unknown rope '" + kind + "'");
  r.kind = kind == "neox" ? RopeConfig::Kind::kNeox : RopeConfig::Kind::kNormal;
  auto number = [&](const char* key, double* out) -> Status {
    auto it = m.find(key);
    if (it == m.end()) return Status::InvalidArgument(std::string("capture metadata: no ") + key);
    char* end = nullptr;
    *out = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end || !std::isfinite(*out))
      return Status::InvalidArgument(std::string("capture metadata: bad ") + key);
    return Status::Ok();
  };
  double dims = 0;
  CG_RETURN_IF_ERROR(number("rope_dims", &dims));
  CG_RETURN_IF_ERROR(number("rope_theta", &r.freq_base));
  CG_RETURN_IF_ERROR(number("rope_scale", &r.freq_scale));
  if (!(dims >= 0 && dims <= 65536)) return Status::InvalidArgument("capture metadata: bad rope_dims");
  r.dims = static_cast<uint32_t>(dims);
  return r;
}

KVMetadata RopeMetadata(const RopeConfig& r) {
  if (r.kind == RopeConfig::Kind::kNone) return {{"rope", "none"}};
  return {{"rope", r.kind == RopeConfig::Kind::kNeox ? "neox" : "normal"},
          {"rope_dims", std::to_string(r.dims)},
          {"rope_theta", fmt::format("{}", r.freq_base)},
          {"rope_scale", fmt::format("{}", r.freq_scale)}};
}

int Fail(const Status& st) {
  std::fprintf(stderr, "cachegen: error: %s\n", st.message().c_str());
  return 1;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // The epsilon keeps 0.99 x 100 (98.99999... in binary) at index 99.
  const double at = q * static_cast<double>(sorted.size()) + 1e-9;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(at))];
}

Result<std::vector<double>> ParsePositiveList(const std::string& option, const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : SplitList(text)) {
    double v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size() || !(v > 0) || !std::isfinite(v))
      return Status::InvalidArgument(option + ": '" + item + "' is not a number > 0");
    out.push_back(v);
  }
  if (out.empty()) return Status::InvalidArgument(option + ": no values in '" + text + "'");
  return out;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}


Result<SyntheticSpec> ParseSyntheticSpec(const std::string& spec) {
  std::vector<uint64_t> v;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string part = spec.substr(pos, comma - pos);
    if (part.empty() || part.size() > 19 || part.find_first_not_of("0123456789") != std::string::npos)
      return Status::InvalidArgument("synthetic spec '" + spec + "': want L,H,D,T[,seed] (non-negative integers)");
    v.push_back(std::stoull(part));
    pos = comma + 1;
  }
  if (v.size() != 4 && v.size() != 5)
    return Status::InvalidArgument("synthetic spec '" + spec + "': want L,H,D,T[,seed]");
  for (size_t i = 0; i < 4; ++i)
    if (v[i] > 0xffffffffu) return Status::InvalidArgument("synthetic spec '" + spec + "': dimension too large");
  SyntheticSpec s;
  s.shape.layers = static_cast<uint32_t>(v[0]);
  s.shape.kv_heads = static_cast<uint32_t>(v[1]);
  s.shape.head_dim = static_cast<uint32_t>(v[2]);
  s.shape.tokens = static_cast<uint32_t>(v[3]);
  if (v.size() == 5) s.seed = v[4];
  CG_RETURN_IF_ERROR(s.shape.Validate());
  return s;
}

Result<KVTensor> LoadInput(const std::string& input) {
  constexpr std::string_view kPrefix = "synthetic:";
  if (input.compare(0, kPrefix.size(), kPrefix) == 0) {
    CG_ASSIGN_OR_RETURN(SyntheticSpec s, ParseSyntheticSpec(input.substr(kPrefix.size())));
    return SyntheticKV(s.shape, DType::kF16, s.seed);
  }
  return ReadKV(input);
}

Quality Compare(const KVTensor& a, const KVTensor& b) {
  const KVShape& s = a.shape();
  const uint64_t C = s.channels();
  std::vector<float> ra(C), rb(C);
  double sig[2] = {0, 0}, err[2] = {0, 0}, mx[2] = {0, 0};
  const KVView va = a.view(), vb = b.view();
  for (uint32_t l = 0; l < s.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue}) {
      const int k = static_cast<int>(kv);
      for (uint32_t t = 0; t < s.tokens; ++t) {
        va.ReadRow(l, kv, t, ra.data());
        vb.ReadRow(l, kv, t, rb.data());
        for (uint64_t c = 0; c < C; ++c) {
          const double d = static_cast<double>(ra[c]) - rb[c];
          sig[k] += static_cast<double>(ra[c]) * ra[c];
          err[k] += d * d;
          mx[k] = std::max(mx[k], std::abs(d));
        }
      }
    }
  auto snr = [](double s, double e) {
    return e == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(s / e);
  };
  return Quality{snr(sig[0], err[0]), snr(sig[1], err[1]), mx[0], mx[1]};
}

}  // namespace cachegen::cli
