// `cachegen store ...`: operator commands on a chunk store given by URI.
//   stat    entries, bytes, levels of a file:// store (or reachability of any store)
//   verify  reads and verifies every record of a file:// store
//   put/get one frame by key and level
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "cachegen/cli.h"
#include "cachegen/codec.h"
#include "cachegen/command.h"
#include "cachegen/profile.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"
#include "store/file_store.h"

namespace cachegen::cli {
namespace {

struct StoreArgs {
  std::string uri;
  bool json = false;
  bool delete_corrupt = false;
  bool bind = false;  // put: BindFrameToChunk first
  bool deep = false;  // verify: the frames inside the records too
  std::string key;
  uint32_t level = 0;
  std::string file;  // put: input; get: output
};

int RunStat(const StoreArgs& a) {
  auto s = OpenStore(a.uri, {.create = false});
  if (!s.ok()) return Fail(s.status());
  auto* fs = dynamic_cast<store::FileStore*>(s->get());
  if (!fs) {
    // Nothing to list without scanning a remote keyspace; opening it proved it answers.
    if (a.json)
      std::printf("%s\n", nlohmann::json{{"uri", (*s)->uri()}, {"reachable", true}}.dump().c_str());
    else
      std::printf("%s: reachable (entry listing is available for file:// stores only)\n", (*s)->uri().c_str());
    return 0;
  }
  auto scan = fs->Scan(false);
  if (!scan.ok()) return Fail(scan.status());
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> levels;  // level -> (entries, bytes)
  std::map<std::string, bool> chunks;
  int64_t oldest = 0, newest = 0;
  for (const auto& e : scan->entries) {
    auto& l = levels[e.level];
    ++l.first;
    l.second += e.size;
    chunks[e.key.Hex()] = true;
    if (!oldest || e.mtime_ns < oldest) oldest = e.mtime_ns;
    newest = std::max(newest, e.mtime_ns);
  }
  if (a.json) {
    nlohmann::json j{{"uri", fs->uri()},          {"entries", scan->entries.size()},
                     {"chunks", chunks.size()},   {"bytes", scan->total_bytes},
                     {"max_bytes", fs->max_bytes()}, {"temp_files", scan->temp_files}};
    j["levels"] = nlohmann::json::array();
    for (const auto& [level, v] : levels) j["levels"].push_back({{"level", level}, {"entries", v.first}, {"bytes", v.second}});
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s\n  entries %zu (%zu chunks), %.3f MB in records", fs->uri().c_str(), scan->entries.size(),
              chunks.size(), static_cast<double>(scan->total_bytes) / 1e6);
  if (fs->max_bytes()) std::printf(" of a %.3f MB budget", static_cast<double>(fs->max_bytes()) / 1e6);
  std::printf("\n  temp files (writes in flight or left by a crash) %llu\n",
              static_cast<unsigned long long>(scan->temp_files));
  for (const auto& [level, v] : levels)
    std::printf("  level %u: %llu entries, %.3f MB\n", level, static_cast<unsigned long long>(v.first),
                static_cast<double>(v.second) / 1e6);
  // Seconds since a use; time() has whole seconds, so a use in the current second is 0, not -0.
  const auto ago_s = [](double ns) { return std::max(0.0, (static_cast<double>(std::time(nullptr)) * 1e9 - ns) / 1e9); };
  if (!scan->entries.empty())
    std::printf("  least recent use %.0f s ago, most recent %.0f s ago\n", ago_s(static_cast<double>(oldest)),
                ago_s(static_cast<double>(newest)));
  return 0;
}

// --deep: what a record holds must be what a reader takes: a frame bound to
// the record's key and level whose sections verify and that decodes (a
// frame coded with a model profile is verified, not decoded: the profile is
// not at hand), or a model profile (ModelProfileKey, level 0).
Status VerifyStoredFrame(std::span<const uint8_t> bytes, const ChunkKey& key, uint32_t level) {
  Result<FrameInfo> info = FrameIsStoredAs(bytes, key, level);
  if (!info.ok()) {
    if (level == 0 && Profile::Parse(bytes).ok()) return Status::Ok();
    return info.status();
  }
  KVTensor out = KVTensor::Unfilled(info->shape, DType::kF16);
  const Status st = DecodeFrame(bytes, out.view());
  return st.code() == StatusCode::kNotFound ? Status::Ok() : st;  // kNotFound: its model profile is not here
}

int RunVerify(const StoreArgs& a) {
  auto s = OpenStore(a.uri, {.create = false});
  if (!s.ok()) return Fail(s.status());
  auto* fs = dynamic_cast<store::FileStore*>(s->get());
  if (!fs) return Fail(Status::InvalidArgument("store verify scans file:// stores only"));
  auto scan = fs->Scan(false);
  if (!scan.ok()) return Fail(scan.status());
  uint64_t ok = 0, bad = 0, deleted = 0;
  nlohmann::json corrupt = nlohmann::json::array();
  std::vector<uint8_t> bytes;
  for (const auto& e : scan->entries) {
    Status st = fs->VerifyEntry(e, a.deep ? &bytes : nullptr);
    if (st.ok() && a.deep) st = VerifyStoredFrame(bytes, e.key, e.level);
    if (st.ok()) {
      ++ok;
      continue;
    }
    if (st.code() == StatusCode::kIOError && !std::filesystem::exists(fs->root() + "/" + e.path)) continue;  // removed meanwhile
    ++bad;
    if (a.delete_corrupt) {
      std::error_code ec;
      if (std::filesystem::remove(fs->root() + "/" + e.path, ec)) ++deleted;
    }
    if (a.json)
      corrupt.push_back({{"path", e.path}, {"error", st.message()}});
    else
      std::printf("corrupt %s: %s\n", e.path.c_str(), st.message().c_str());
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"uri", fs->uri()}, {"verified", ok}, {"corrupt", bad}, {"deleted", deleted},
                                       {"corrupt_entries", corrupt}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%s: %llu records verified, %llu corrupt", fs->uri().c_str(), static_cast<unsigned long long>(ok),
                static_cast<unsigned long long>(bad));
    if (a.delete_corrupt) std::printf(", %llu deleted", static_cast<unsigned long long>(deleted));
    std::printf("\n");
  }
  if (bad && !a.delete_corrupt) {
    std::fprintf(stderr, "cachegen: error: %llu corrupt records (--delete-corrupt removes them)\n",
                 static_cast<unsigned long long>(bad));
    return 1;
  }
  return 0;
}

int RunPut(const StoreArgs& a) {
  auto key = ChunkKey::FromHex(a.key);
  if (!key.ok()) return Fail(key.status());
  std::ifstream in(a.file, std::ios::binary);
  if (!in) return Fail(Status::IOError("cannot open " + a.file));
  std::vector<uint8_t> frame((std::istreambuf_iterator<char>(in)), {});
  if (a.bind) {
    Result<std::vector<uint8_t>> bound = BindFrameToChunk(frame, *key);
    if (!bound.ok()) return Fail(Status::InvalidArgument("--bind: " + a.file + ": " + bound.status().message()));
    frame = std::move(bound).value();
  }
  auto s = OpenStore(a.uri);
  if (!s.ok()) return Fail(s.status());
  const Status st = (*s)->Put(*key, a.level, frame);
  if (!st.ok()) return Fail(st);
  std::printf("stored %s/%u: %zu bytes\n", key->Hex().c_str(), a.level, frame.size());
  return 0;
}

int RunGet(const StoreArgs& a) {
  auto key = ChunkKey::FromHex(a.key);
  if (!key.ok()) return Fail(key.status());
  auto s = OpenStore(a.uri, {.create = false});
  if (!s.ok()) return Fail(s.status());
  auto frame = (*s)->Get(*key, a.level);
  if (!frame.ok()) return Fail(frame.status());
  std::ofstream out(a.file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(frame->data()), static_cast<std::streamsize>(frame->size()));
  if (!out) return Fail(Status::IOError("cannot write " + a.file));
  std::printf("wrote %s: %zu bytes (verified)\n", a.file.c_str(), frame->size());
  return 0;
}

const bool kRegistered = RegisterCommand(45, [](CLI::App& root) -> CommandRunner {
  auto args = std::make_shared<StoreArgs>();
  CLI::App* store = root.add_subcommand("store", "Inspect, verify and access a chunk store (file://, mem://, redis://, redis-cluster://)");
  store->require_subcommand(1);
  const auto add_uri = [&](CLI::App* sub) {
    sub->add_option("--store", args->uri, "Store URI, e.g. file:///var/cache/cachegen")->required();
  };
  CLI::App* stat = store->add_subcommand("stat", "Entries, bytes and levels of a file:// store; reachability of others");
  add_uri(stat);
  stat->add_flag("--json", args->json, "Print one JSON object");
  CLI::App* verify = store->add_subcommand("verify", "Read and verify every record of a file:// store (exit 1 if any is corrupt)");
  add_uri(verify);
  verify->add_flag("--json", args->json, "Print one JSON object");
  verify->add_flag("--delete-corrupt", args->delete_corrupt, "Remove corrupt records (then exit 0)");
  verify->add_flag("--deep", args->deep,
                   "Also check each record's frame: sections against their checksums, bound to its key and "
                   "level, and decoded (frames coded with a model profile are not decoded)");
  CLI::App* put = store->add_subcommand("put", "Store the bytes of IN as the frame of KEY at LEVEL");
  add_uri(put);
  put->add_option("key", args->key, "Chunk key: 32 hex digits")->required();
  put->add_option("level", args->level, "Level (0-7)")->required()->check(CLI::Range(0u, kMaxChunkLevels - 1));
  put->add_option("input", args->file, "File with the frame bytes")->required();
  put->add_flag("--bind", args->bind,
                "Bind the frame to KEY first (a fetch takes only frames bound to the key they are stored under)");
  CLI::App* get = store->add_subcommand("get", "Write the verified frame of KEY at LEVEL to -o OUT");
  add_uri(get);
  get->add_option("key", args->key, "Chunk key: 32 hex digits")->required();
  get->add_option("level", args->level, "Level (0-7)")->required()->check(CLI::Range(0u, kMaxChunkLevels - 1));
  get->add_option("-o,--output", args->file, "Output file")->required();
  return [=]() -> std::optional<int> {
    if (!*store) return std::nullopt;
    if (*stat) return RunStat(*args);
    if (*verify) return RunVerify(*args);
    if (*put) return RunPut(*args);
    return RunGet(*args);
  };
});

}  // namespace
}  // namespace cachegen::cli
