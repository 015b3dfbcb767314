// `oscarkv`: the operator and developer tool. See `oscarkv --help`.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "command.h"

namespace oscarkv::cli {

std::vector<Command>& Registry() {
  static std::vector<Command> registry;
  return registry;
}

namespace {

void PrintHelp() {
  std::printf(
      "oscarkv: a KV-cache memory service with OSCAR INT2-compressed pages.\n\n"
      "usage: oscarkv <command> [options]     (oscarkv <command> --help for its options)\n\n"
      "commands:\n");
  auto cmds = Registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const Command& c : cmds) std::printf("  %-18s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf(
      "\nexit codes: 0 ok, 1 the operation failed (one line on stderr), 2 usage (a bad command,\n"
      "flag or flag value).\n");
}

}  // namespace
}  // namespace oscarkv::cli

int main(int argc, char** argv) {
  using oscarkv::cli::Registry;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    oscarkv::cli::PrintHelp();
    return argc < 2 ? 2 : 0;
  }
  // Two-word commands first ("bench service"), then one-word.
  if (argc >= 3) {
    const std::string two = std::string(argv[1]) + " " + argv[2];
    for (const auto& c : Registry()) {
      if (c.name == two) return c.run(argc - 2, argv + 2);
    }
  }
  for (const auto& c : Registry()) {
    if (c.name == argv[1]) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "oscarkv: unknown command '%s'\n\n", argv[1]);
  oscarkv::cli::PrintHelp();
  return 2;
}
