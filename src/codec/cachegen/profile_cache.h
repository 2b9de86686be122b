// The folder where automatic model profiles are kept (one file per model,
// learned by src/engine/llama/auto_profile.h), and loading what it holds so
// that frames referencing those profiles decode without --profile.
#pragma once

#include <cstdint>
#include <string>

namespace cachegen {

class ProfileSet;  // cachegen/profile.h

// $CACHEGEN_PROFILE_DIR, else $XDG_CACHE_HOME/cachegen/profiles, else
// $HOME/.cache/cachegen/profiles, else cachegen-profiles in the temp directory.
std::string DefaultProfileCacheDir();

// Adds every valid .cgprof in `dir` to `profiles`; files that do not parse
// are skipped. Returns how many were added.
uint32_t AddCachedProfiles(const std::string& dir, ProfileSet& profiles);

}  // namespace cachegen
