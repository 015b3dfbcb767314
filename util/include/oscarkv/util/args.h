// A small command-line parser for `oscarkv <command> [options]` subcommands.
//
// Accepts `--name value`, `--name=value` and boolean `--flag`. Unknown options are an error
// (with the help text), so a typo never silently falls back to a default. Not thread-safe;
// used once per process on argv.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace oscarkv {

class Args {
 public:
  Args(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  // A boolean switch, false unless given.
  Args& Flag(const std::string& name, const std::string& help) {
    specs_.push_back({name, help, "", /*is_flag=*/true});
    return *this;
  }
  // An option taking a value, with a default ("" means no default).
  Args& Option(const std::string& name, const std::string& default_value,
               const std::string& help) {
    specs_.push_back({name, help, default_value, /*is_flag=*/false});
    values_[name] = default_value;
    return *this;
  }
  // Free-form text appended to --help (examples, notes).
  Args& Epilog(const std::string& text) {
    epilog_ = text;
    return *this;
  }

  // argv[0] is the subcommand name. `--help`/`-h` sets help_requested().
  absl::Status Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
        continue;
      }
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      const Spec* spec = Find(name);
      if (spec == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown option --", name, " for '", command_, "'\n\n", Help()));
      }
      if (spec->is_flag) {
        if (has_value && value != "true" && value != "false" && value != "1" && value != "0") {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
        }
        flags_[name] = !has_value || value == "true" || value == "1";
        continue;
      }
      if (!has_value) {
        if (i + 1 >= argc) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = argv[++i];
      }
      values_[name] = value;
      given_[name] = true;
    }
    return absl::OkStatus();
  }

  // The usual subcommand prologue: parses argv; on a usage error prints it ("oscarkv <command>:
  // <message>") and returns 2, on --help prints the help and returns 0; std::nullopt means "go
  // on".
  std::optional<int> ParseOrExitCode(int argc, char** argv) {
    if (absl::Status s = Parse(argc, argv); !s.ok()) {
      std::fprintf(stderr, "oscarkv %s: %s\n", command_.c_str(), std::string(s.message()).c_str());
      return 2;
    }
    if (help_requested()) {
      std::printf("%s", Help().c_str());
      return 0;
    }
    return std::nullopt;
  }

  const std::string& command() const { return command_; }
  bool help_requested() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool flag(const std::string& name) const {
    auto it = flags_.find(name);
    return it != flags_.end() && it->second;
  }
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  std::string str(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? "" : it->second;
  }
  absl::StatusOr<int64_t> integer(const std::string& name) const {
    int64_t v = 0;
    const std::string s = str(name);
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer, got '", s, "'"));
    }
    return v;
  }
  absl::StatusOr<double> real(const std::string& name) const {
    double v = 0;
    const std::string s = str(name);
    if (!absl::SimpleAtod(s, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a number, got '", s, "'"));
    }
    return v;
  }

  std::string Help() const {
    std::string out = absl::StrCat("usage: oscarkv ", command_, " [options]\n\n", summary_, "\n\noptions:\n");
    for (const Spec& s : specs_) {
      std::string left = absl::StrCat("  --", s.name, s.is_flag ? "" : " VALUE");
      if (left.size() < 28) left.resize(28, ' ');
      absl::StrAppend(&out, left, " ", s.help);
      if (!s.is_flag && !s.default_value.empty()) absl::StrAppend(&out, " (default: ", s.default_value, ")");
      absl::StrAppend(&out, "\n");
    }
    absl::StrAppend(&out, "  --help                       show this help\n");
    if (!epilog_.empty()) absl::StrAppend(&out, "\n", epilog_, "\n");
    return out;
  }

 private:
  struct Spec {
    std::string name, help, default_value;
    bool is_flag;
  };
  const Spec* Find(const std::string& name) const {
    for (const Spec& s : specs_) {
      if (s.name == name) return &s;
    }
    return nullptr;
  }
  std::string command_, summary_, epilog_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_, given_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace oscarkv
