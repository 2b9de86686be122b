// SimContext and its JSON form (sim_context.h).
#include "stream/sim_context.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "cachegen/stream.h"
#include "kv/io.h"

namespace cachegen::sim {
namespace {

constexpr uint64_t kMaxContextFileBytes = 64ull << 20;
constexpr size_t kMaxChunks = 1u << 20;

Status Invalid(const std::string& what) { return Status::InvalidArgument("simulation context: " + what); }

// A list of finite numbers >= 0, one per level.
Result<std::vector<double>> PerLevel(const nlohmann::json& j, const char* key, size_t levels) {
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != levels)
    return Invalid(std::string(key) + " must list one number per level (" + std::to_string(levels) + ")");
  std::vector<double> out;
  for (const auto& v : j[key]) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      return Invalid(std::string(key) + " holds a value that is not a finite number >= 0");
    out.push_back(v.get<double>());
  }
  return out;
}

}  // namespace

uint64_t SimContext::LevelBytes(int level) const {
  uint64_t total = 0;
  for (const PlanChunk& c : chunks)
    if (level >= 0 && static_cast<size_t>(level) < c.level_bytes.size()) total += c.level_bytes[level];
  return total;
}

Result<SimContext> ParseSimContext(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("not a JSON object");
  SimContext c;
  if (j.contains("name") && j["name"].is_string()) c.name = j["name"].get<std::string>();
  if (j.contains("source") && j["source"].is_string()) c.source = j["source"].get<std::string>();
  if (!j.contains("level_kl") || !j["level_kl"].is_array()) return Invalid("level_kl missing");
  const size_t levels = j["level_kl"].size();
  if (levels < 1 || levels > kMaxChunkLevels) return Invalid("1 to 8 levels (level_kl), not " + std::to_string(levels));
  CG_ASSIGN_OR_RETURN(c.level_kl, PerLevel(j, "level_kl", levels));
  CG_ASSIGN_OR_RETURN(c.decode_s_per_token, PerLevel(j, "decode_s_per_token", levels));
  if (j.contains("decode_cv")) {
    if (!j["decode_cv"].is_number() || !(j["decode_cv"].get<double>() >= 0) || !(j["decode_cv"].get<double>() <= 10))
      return Invalid("decode_cv must be a number in [0, 10]");
    c.decode_cv = j["decode_cv"].get<double>();
  }
  if (!j.contains("chunks") || !j["chunks"].is_array() || j["chunks"].empty() || j["chunks"].size() > kMaxChunks)
    return Invalid("chunks must list 1 to " + std::to_string(kMaxChunks) + " chunks");
  for (const auto& k : j["chunks"]) {
    const std::string at = "chunk " + std::to_string(c.chunks.size());
    if (!k.is_object() || !k.contains("tokens") || !k["tokens"].is_number_unsigned() || k["tokens"].get<uint64_t>() == 0 ||
        k["tokens"].get<uint64_t>() > (1u << 24))
      return Invalid(at + ": tokens must be an integer in [1, 2^24]");
    if (!k.contains("bytes") || !k["bytes"].is_array() || k["bytes"].size() != levels)
      return Invalid(at + ": bytes must list one size per level");
    PlanChunk chunk;
    chunk.tokens = k["tokens"].get<uint32_t>();
    for (const auto& b : k["bytes"]) {
      if (!b.is_number_unsigned() || b.get<uint64_t>() > (1ull << 40)) return Invalid(at + ": a size is not an integer in [0, 2^40]");
      chunk.level_bytes.push_back(b.get<uint64_t>());
    }
    if (std::all_of(chunk.level_bytes.begin(), chunk.level_bytes.end(), [](uint64_t b) { return b == 0; }))
      return Invalid(at + ": no level stored");
    c.chunks.push_back(std::move(chunk));
  }
  return c;
}

Result<SimContext> LoadSimContext(const std::string& path) {
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path, kMaxContextFileBytes));
  Result<SimContext> c = ParseSimContext(std::string(bytes.begin(), bytes.end()));
  if (!c.ok()) return Status::InvalidArgument(path + ": " + c.status().message());
  return c;
}

std::string SimContextJson(const SimContext& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  j["source"] = c.source;
  j["level_kl"] = c.level_kl;
  j["decode_s_per_token"] = c.decode_s_per_token;
  j["decode_cv"] = c.decode_cv;
  nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
  for (const PlanChunk& k : c.chunks) chunks.push_back({{"tokens", k.tokens}, {"bytes", k.level_bytes}});
  j["chunks"] = std::move(chunks);
  return j.dump(1) + "\n";
}

}  // namespace cachegen::sim
