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
// to_read: the store is only read, so a file:// one must exist
// (OpenStoreOptions::create).
Result<std::unique_ptr<ChunkStore>> OpenTarget(const StoreTarget& target, bool to_read);

// A bearer token file: its content with surrounding whitespace removed; empty is an error.
Result<std::string> ReadTokenFile(const std::string& path);

}  // namespace cachegen::cli
