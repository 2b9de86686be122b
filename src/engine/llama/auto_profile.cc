#include "engine/llama/auto_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <system_error>

#include <fmt/format.h>

#include "codec/cachegen/profile_data.h"
#include "engine/llama/completion_engine.h"
#include "engine/llama/profile_train.h"
#include "kv/io.h"

namespace cachegen::engine {
namespace {

namespace fs = std::filesystem;

// What an automatic profile is learned from (a change here must change
// kAutoProfileSettings, so that profiles made otherwise are not read).
constexpr uint64_t kAutoSeed = 0x6361636865676e31;  // fixed: the same model learns the same profile

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The cache file name: the fingerprint (letters, digits, '.', '-' and '_'
// only), the settings, and the windows when they are not the defaults.
std::string FileNameOf(const std::string& fingerprint, const AutoProfileOptions& o) {
  std::string s = fingerprint + CacheTypesTag(o.cache);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  const AutoProfileOptions defaults;
  const bool other = o.windows != defaults.windows || o.context != defaults.context ||
                     o.continuation != defaults.continuation;
  return s + "-" + kAutoProfileSettings +
         (other ? fmt::format("-w{}c{}m{}", o.windows, o.context, o.continuation) : std::string()) + ".cgprof";
}

// A cached profile, when the file holds a valid one that fits the model.
std::shared_ptr<const Profile> ReadCached(const std::string& path, const LlamaModelInfo& info) {
  Result<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return nullptr;
  Result<std::shared_ptr<const Profile>> p = Profile::Parse(*bytes);
  if (!p.ok()) return nullptr;
  const Profile& q = **p;
  if (q.layers() != info.layers || q.kv_heads() != info.kv_heads || q.head_dim() != info.head_dim ||
      q.data().sensitivity.empty())
    return nullptr;
  return *p;
}

// Writes through a temporary file and a rename, so that a reader never sees half a profile.
Status WriteAtomically(const std::string& path, std::span<const uint8_t> bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return Status::IOError("cannot create '" + fs::path(path).parent_path().string() + "': " + ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  CG_RETURN_IF_ERROR(WriteFileBytes(tmp, bytes));
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::IOError("cannot rename into '" + path + "'");
  }
  return Status::Ok();
}

// A token drawn from softmax(logits) with uniform variate u in [0, 1).
int32_t SampleToken(std::span<const float> logits, double u) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float l : logits) total += std::exp(double(l) - top);
  double acc = 0;
  const double goal = u * total;
  for (size_t i = 0; i < logits.size(); ++i) {
    acc += std::exp(double(logits[i]) - top);
    if (acc > goal) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(logits.size() - 1);
}

// The options' model, loaded from its path unless given.
Result<std::shared_ptr<LlamaModel>> ModelOf(const AutoProfileOptions& o) {
  if (o.model) return o.model;
  return LlamaModel::Load(o.model_path);
}

// The cache file of the model at `model_path`, and the cached profile when
// valid (else null).
Result<AutoProfile> LookUpCache(const AutoProfileOptions& o, const std::shared_ptr<LlamaModel>& model,
                                std::chrono::steady_clock::time_point t0) {
  std::string fingerprint = o.fingerprint;
  if (fingerprint.empty()) {
    CG_ASSIGN_OR_RETURN(fingerprint, ModelFingerprint(o.model_path, model->info()));
  }
  AutoProfile out;
  out.path = (fs::path(o.cache_dir.empty() ? DefaultProfileCacheDir() : o.cache_dir) / FileNameOf(fingerprint, o)).string();
  if ((out.profile = ReadCached(out.path, model->info()))) {
    out.seconds = SecondsSince(t0);
    out.source = "read from " + out.path + " (learned earlier from text the model wrote itself)";
  }
  return out;
}

}  // namespace

double DefaultBestLevelKl(const Profile& profile) {
  constexpr double kShareOfQ8Kl = 0.5;
  return kShareOfQ8Kl * profile.data().q8_kl;
}

Result<std::vector<std::vector<int32_t>>> SampleModelWindows(const std::shared_ptr<LlamaModel>& model,
                                                            uint32_t count, uint32_t length, uint64_t seed,
                                                            uint32_t threads) {
  const LlamaModelInfo& info = model->info();
  if (info.bos < 0) return Status::Unsupported("the model has no BOS token to start its own text with");
  if (length < 2) return Status::InvalidArgument("sampled windows need at least 2 tokens");
  LlamaContextOptions co;
  co.n_ctx = length + 8;
  co.threads = threads;
  CG_ASSIGN_OR_RETURN(std::unique_ptr<LlamaContext> ctx, LlamaContext::Create(model, co));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> windows(count);
  for (std::vector<int32_t>& w : windows) {
    ctx->Clear();
    w.assign(1, info.bos);
    while (w.size() < length) {
      CG_RETURN_IF_ERROR(ctx->Eval(std::span<const int32_t>(&w.back(), 1), static_cast<int32_t>(w.size() - 1)));
      int32_t t = SampleToken(ctx->Logits(0), double(rng() >> 11) * 0x1.0p-53);
      if (t == info.eos) t = info.bos;  // a new document, as eval joins stories
      w.push_back(t);
    }
  }
  return windows;
}

Result<AutoProfile> CachedModelProfile(const AutoProfileOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  CG_ASSIGN_OR_RETURN(std::shared_ptr<LlamaModel> model, ModelOf(o));
  CG_ASSIGN_OR_RETURN(AutoProfile out, LookUpCache(o, model, t0));
  if (!out.profile) return Status::NotFound("no automatic profile of this model in " + out.path);
  return out;
}

Result<AutoProfile> AutoModelProfile(const AutoProfileOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  CG_ASSIGN_OR_RETURN(std::shared_ptr<LlamaModel> model, ModelOf(o));
  CG_ASSIGN_OR_RETURN(AutoProfile out, LookUpCache(o, model, t0));
  if (out.profile) return out;
  if (o.progress) o.progress("profile: learning this model's profile from text it writes itself (once per model)");
  ModelProfileOptions po;
  po.model_path = o.model_path;
  po.model = model;
  po.contexts = o.windows;
  po.context = o.context;
  po.continuation = o.continuation;
  po.threads = o.threads;
  po.cache = o.cache;
  po.tuning.quantizer = CodecConfig::Quantizer::kLloyd;  // as `profile train`
  po.progress = o.progress;
  CG_ASSIGN_OR_RETURN(po.windows, SampleModelWindows(model, o.windows, o.context + o.continuation + 1,
                                                     kAutoSeed, o.threads));
  CG_ASSIGN_OR_RETURN(ModelProfile learned, TrainModelProfile(po));
  out.profile = learned.profile;
  out.learned = true;
  out.seconds = SecondsSince(t0);
  const Status saved = WriteAtomically(out.path, out.profile->bytes());
  out.source = fmt::format("learned in {:.1f} s from {} windows of text the model wrote itself ({})", out.seconds,
                           learned.contexts,
                           saved.ok() ? "kept in " + out.path : "not kept: " + saved.message());
  return out;
}

}  // namespace cachegen::engine
