#include "cachegen/command.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace cachegen::cli {
namespace {

struct Entry {
  int order;
  CommandSetup setup;
};

// A function-local static, so registration from other files' static
// initialisers never runs before the vector exists.
std::vector<Entry>& Registry() {
  static std::vector<Entry> entries;
  return entries;
}

}  // namespace

bool RegisterCommand(int order, CommandSetup setup) {
  Registry().push_back({order, std::move(setup)});
  return true;
}

std::vector<CommandRunner> AddRegisteredCommands(CLI::App& root) {
  std::vector<Entry> entries = Registry();
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.order < b.order; });
  std::vector<CommandRunner> runners;
  for (const Entry& e : entries) runners.push_back(e.setup(root));
  return runners;
}

}  // namespace cachegen::cli
