// Subcommand registry of the cachegen tool.
//
// The core commands (encode, decode, inspect, bench, demo) live in main.cc.
// Every other command lives in its own file and registers itself at static
// initialisation, so adding a command touches no shared file:
//
//   namespace {
//   const bool kRegistered = cachegen::cli::RegisterCommand(
//       40, [](CLI::App& root) -> cachegen::cli::CommandRunner {
//         auto args = std::make_shared<FetchArgs>();
//         CLI::App* sub = root.add_subcommand("fetch", "...");
//         sub->add_option(...);
//         return [sub, args] { return *sub ? std::optional<int>(RunFetch(*args)) : std::nullopt; };
//       });
//   }
//
// `order` sorts the commands in --help (core commands use 0-9).
#pragma once

#include <functional>
#include <optional>

#include <CLI/CLI.hpp>

namespace cachegen::cli {

// Called after parsing: returns the exit code when its subcommand was chosen,
// std::nullopt otherwise.
using CommandRunner = std::function<std::optional<int>()>;
// Adds the subcommand and its options to the root app.
using CommandSetup = std::function<CommandRunner(CLI::App& root)>;

// Always returns true (for use in a namespace-scope initialiser).
bool RegisterCommand(int order, CommandSetup setup);

// Adds every registered command to `root`, in `order`; returns their runners.
std::vector<CommandRunner> AddRegisteredCommands(CLI::App& root);

}  // namespace cachegen::cli
