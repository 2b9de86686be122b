// The folder where automatic model profiles are kept (one file per model,
// learned by src/engine/llama/auto_profile.h), and registering what it holds
// so that frames referencing those profiles decode without --profile.
#pragma once

#include <cstdint>
#include <string>

namespace cachegen {

// $CACHEGEN_PROFILE_DIR, else $XDG_CACHE_HOME/cachegen/profiles, else
// $HOME/.cache/cachegen/profiles, else cachegen-profiles in the temp directory.
std::string DefaultProfileCacheDir();

// Registers (RegisterProfile) every valid .cgprof in `dir`; files that do
// not parse are skipped. Returns how many were registered.
uint32_t RegisterCachedProfiles(const std::string& dir);

}  // namespace cachegen
