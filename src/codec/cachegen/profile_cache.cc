#include "codec/cachegen/profile_cache.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "cachegen/profile.h"
#include "kv/io.h"

namespace cachegen {

namespace fs = std::filesystem;

std::string DefaultProfileCacheDir() {
  if (const char* d = std::getenv("CACHEGEN_PROFILE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "cachegen" / "profiles").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "cachegen" / "profiles").string();
  return (fs::temp_directory_path() / "cachegen-profiles").string();
}

uint32_t AddCachedProfiles(const std::string& dir, ProfileSet& profiles) {
  std::error_code ec;
  uint32_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".cgprof") continue;
    Result<std::vector<uint8_t>> bytes = ReadFileBytes(it->path().string());
    if (!bytes.ok()) continue;
    Result<std::shared_ptr<const Profile>> p = Profile::Parse(*bytes);
    if (!p.ok()) continue;
    profiles.Add(*p);
    ++n;
  }
  return n;
}

}  // namespace cachegen
