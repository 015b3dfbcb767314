// Subcommand registry for the `oscarkv` tool. Each cmd_*.cc registers its commands with
// OSCARKV_COMMAND; main.cc dispatches on the first one or two words ("codec", "bench service").
// A command returns the process exit code: 0 ok, 1 failure, 2 usage error.
#pragma once

#include <string>
#include <vector>

namespace oscarkv::cli {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is the command name

struct Command {
  std::string name;     // one or two words
  std::string summary;  // one line for `oscarkv --help`
  CommandFn run;
};

std::vector<Command>& Registry();

struct Registrar {
  Registrar(std::string name, std::string summary, CommandFn fn) {
    Registry().push_back({std::move(name), std::move(summary), fn});
  }
};

}  // namespace oscarkv::cli

#define OSCARKV_CLI_CONCAT_INNER(a, b) a##b
#define OSCARKV_CLI_CONCAT(a, b) OSCARKV_CLI_CONCAT_INNER(a, b)
#define OSCARKV_COMMAND(name, summary, fn) \
  static ::oscarkv::cli::Registrar OSCARKV_CLI_CONCAT(oscarkv_cmd_, __LINE__)(name, summary, fn)
