// cachegen slot compress|restore: llama-server slot files (POST
// /slots/{id}?action=save) in and out of cachegen, so an unmodified
// llama-server's saved slots are stored compressed and restored with
// action=restore.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/command.h"
#include "cachegen/profile.h"
#include "engine/llama_slot_file.h"
#include "kv/io.h"

namespace cachegen::cli {
namespace {

struct SlotArgs {
  std::string input, output;
  CodecConfig codec;
  uint32_t kv_heads = 0, level = 0, threads = 0;
  bool json = false, quantizer_given = false;
  RopeArgs rope;
  std::string profile;
};

int RunCompress(const SlotArgs& a) {
  Result<std::vector<uint8_t>> in = ReadFileBytes(a.input);
  if (!in.ok()) return Fail(in.status());
  Result<RopeConfig> rope = ResolveRope(a.rope);
  if (!rope.ok()) return Fail(rope.status());
  CodecConfig codec = a.codec;
  codec.rope = *rope;
  if (a.profile.empty() && !a.rope.model.empty() && codec.codec == "cachegen") {
    Result<ModelProfileFacts> p = AutomaticModelProfile(a.rope.model);
    if (!p.ok()) return Fail(p.status());
    codec.profile = p->profile;
    if (!a.quantizer_given) codec.quantizer = p->profile->quantizer().value_or(codec.quantizer);
    std::fprintf(stderr, "cachegen slot compress: automatic profile %s\n", p->source.c_str());
  } else if (!a.profile.empty() && a.profile != "none") {
    if (Status st = UseProfileFile(a.profile, a.quantizer_given, &codec); !st.ok()) return Fail(st);
  }
  uint32_t kv_heads = a.kv_heads;
  if (kv_heads == 0 && !a.rope.model.empty()) {
    Result<ModelKeyFacts> m = ReadModelKeyFacts(a.rope.model);
    if (!m.ok()) return Fail(m.status());
    kv_heads = m->kv_heads;
  }
  EncodeStats stats;
  Result<std::vector<uint8_t>> out = engine::CompressSlotFile(*in, codec, kv_heads, &stats, BlockQuantizer());
  if (!out.ok()) {
    std::fprintf(stderr, "cachegen: error: '%s': %s\n", a.input.c_str(), out.status().message().c_str());
    return 1;
  }
  Status st = WriteFileBytes(a.output, *out);
  if (!st.ok()) return Fail(st);
  const double ratio = static_cast<double>(in->size()) / static_cast<double>(out->size());
  if (a.json) {
    std::puts(nlohmann::json({{"input", a.input},
                              {"output", a.output},
                              {"input_bytes", in->size()},
                              {"output_bytes", out->size()},
                              {"ratio", ratio},
                              {"level_bits_per_value", stats.level_bits_per_value},
                              {"level_predicted_kl", PredictsKl(stats) ? nlohmann::json(stats.level_predicted_kl)
                                                                       : nlohmann::json(nullptr)}})
                  .dump(2)
                  .c_str());
  } else {
    std::printf("%s: %zu -> %zu bytes (%.2fx), codec %s\n", a.output.c_str(), in->size(), out->size(), ratio,
                a.codec.codec.c_str());
  }
  return 0;
}

int RunRestore(const SlotArgs& a) {
  Result<std::vector<uint8_t>> in = ReadFileBytes(a.input);
  if (!in.ok()) return Fail(in.status());
  Result<std::shared_ptr<const ProfileSet>> profiles = DecodeProfiles(a.profile);
  if (!profiles.ok()) return Fail(profiles.status());
  Result<std::vector<uint8_t>> out = engine::RestoreSlotFile(*in, a.level, a.threads, profiles->get(), BlockQuantizer());
  if (!out.ok()) {
    std::fprintf(stderr, "cachegen: error: '%s': %s\n", a.input.c_str(), out.status().message().c_str());
    return 1;
  }
  Status st = WriteFileBytes(a.output, *out);
  if (!st.ok()) return Fail(st);
  std::printf("%s: llama.cpp slot file, %zu bytes (level %u)\n", a.output.c_str(), out->size(), a.level);
  return 0;
}

const bool kRegistered = RegisterCommand(30, [](CLI::App& root) -> CommandRunner {
  auto a = std::make_shared<SlotArgs>();
  CLI::App* slot = root.add_subcommand("slot", "Compress and restore llama-server slot files (/slots save/restore)");
  slot->require_subcommand(1);
  CLI::App* c = slot->add_subcommand("compress", "llama.cpp slot file -> .cgslot");
  c->add_option("input", a->input, "Slot file written by llama-server (--slot-save-path)")->required();
  c->add_option("-o,--output", a->output, "Output .cgslot")->required();
  c->add_option("--codec", a->codec.codec, "Codec")->capture_default_str();
  auto* ob = c->add_option("--bits", a->codec.bits_per_value, "Target bits per value (cachegen codec)");
  auto* os = c->add_option("--snr-db", a->codec.snr_db, "Target per-layer SNR in dB (cachegen codec)");
  auto* ok = c->add_option("--max-kl", a->codec.max_kl,
                           "Target predicted mean next-token KL (cachegen codec; needs --profile with sensitivities)")
                 ->check(Positive());
  ob->excludes(os)->excludes(ok);
  os->excludes(ob)->excludes(ok);
  ok->excludes(ob)->excludes(os);
  c->add_option("--levels", a->codec.levels, "Quality levels")->capture_default_str();
  c->add_option("--kv-heads", a->kv_heads, "KV heads per layer (0: the --model's, else head dim 128, else 64, else the whole row)")
      ->capture_default_str();
  c->add_flag("--json", a->json, "Print a JSON summary");
  AddRopeOptions(c, &a->rope, /*model_flag=*/true);
  AddQuantizerOption(c, &a->codec, &a->quantizer_given);
  c->add_option("--profile", a->profile,
                "cachegen: code with this model profile (.cgprof; its quantizer too); none: without one; default "
                "with --model: the model's automatic profile (learned once from text the model writes itself)");
  CLI::App* r = slot->add_subcommand("restore", ".cgslot -> llama.cpp slot file");
  r->add_option("input", a->input, ".cgslot file")->required();
  r->add_option("-o,--output", a->output, "Slot file for llama-server's action=restore")->required();
  r->add_option("--level", a->level, "Quality level to decode (0 = best)")->capture_default_str();
  r->add_option("--threads", a->threads, "Decode threads (0 = all cores)")->capture_default_str();
  r->add_option("--profile", a->profile,
                "The model profile the .cgslot was compressed with (.cgprof; default: the automatic profiles cached here)");
  return [slot, c, r, a]() -> std::optional<int> {
    if (!*slot) return std::nullopt;
    if (*c) return RunCompress(*a);
    if (*r) return RunRestore(*a);
    return 2;
  };
});

}  // namespace
}  // namespace cachegen::cli
