// Runs one of the project's programs (the `oscarkv` tool, client_c_abi_test) from a test,
// through util's subprocess helper.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::testing {

// `program args` to completion, `args` split at spaces (the tests pass none inside one): its exit
// code (-1 when it could not run, was killed or ran past `timeout`), stdout and stderr together
// in *out.
inline int RunTool(const std::string& program, const std::string& args, std::string* out,
                   absl::Duration timeout = absl::Seconds(100)) {
  std::vector<std::string> argv = {program};
  for (absl::string_view a : absl::StrSplit(args, ' ', absl::SkipEmpty())) argv.emplace_back(a);
  SpawnOptions options(std::move(argv));
  options.stderr_to_stdout = true;
  auto r = RunAndCollect(std::move(options), timeout);
  if (!r.ok()) {
    *out = r.status().ToString();
    return -1;
  }
  *out = std::move(r->output);
  return r->exit_code;
}

}  // namespace oscarkv::testing
