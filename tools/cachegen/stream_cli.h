// Shared options of the store/service commands (serve, put, fetch, bench-stream).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cachegen/status.h"
#include "cachegen/store.h"

namespace cachegen::cli {

// Where chunks live: --server URL (a cachegen service) or --store URI (a
// backend used directly), exactly one.
struct StoreTarget {
  std::string server, store, token_file;
};
void AddStoreTargetOptions(CLI::App* app, StoreTarget* target);
// to_read: the store is only read (OpenStoreToRead).
Result<std::unique_ptr<ChunkStore>> OpenTarget(const StoreTarget& target, bool to_read);

// OpenStore for a command that only reads: a file:// store must exist
// already. Opening one creates its directory, so a mistyped path would read
// as an empty store (nothing cached, nothing corrupt) and leave a directory
// behind.
Result<std::unique_ptr<ChunkStore>> OpenStoreToRead(const std::string& uri);

// A bearer token file: its content with surrounding whitespace removed; empty is an error.
Result<std::string> ReadTokenFile(const std::string& path);

}  // namespace cachegen::cli
