// Helpers of pd's tests: the reference model, a codec small enough that INT2 history pages
// occur in a short prompt, and daemons as child processes.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "oscarkv/client/handles.h"
#include "oscarkv/testing/local_daemon.h"
#include "oscarkv/pd/workers.h"
#include "oscarkv/util/refmodel.h"

namespace oscarkv::pd::testing {

inline std::string SourceDir() {
  const char* s = std::getenv("OSCARKV_SOURCE_DIR");
  return s ? s : ".";
}
inline std::string BinaryDir() {
  const char* s = std::getenv("OSCARKV_BINARY_DIR");
  return s ? s : "..";
}

// The reference model (util/refmodel.h: $OSCARKV_REFMODEL, else ../shared/refmodel); empty
// when absent.
inline std::string RefModelDir() { return FindRefModel(); }

// page 16, sink 16, recent 32: a 300-byte prompt has a BF16 sink page, ~15 INT2 history pages
// and a BF16 tail.
inline CodecOptions SmallCodec() {
  CodecOptions o;
  o.page_tokens = 16;
  o.sink_tokens = 16;
  o.recent_tokens = 32;
  return o;
}

inline const char* Prompt() {
  return "The git-rebase command reapplies commits on top of another base tip. If <branch> is "
         "specified, git rebase will perform an automatic git switch <branch> before doing "
         "anything else. Otherwise it remains on the current branch. If the upstream is not "
         "specified, the upstream configured in branch.<name>.remote and branch.<name>.merge "
         "options will be used.";
}

inline absl::StatusOr<std::unique_ptr<oscarkv::testing::LocalDaemon>> StartDaemon(
    std::vector<std::string> extra = {}) {
  oscarkv::testing::LocalDaemonOptions o;
  o.flags = {"--pool-mb", "64",  "--metrics-listen",  "off", "--log-level", "warn",
             "--ucx-tls", "tcp", "--ucx-net-devices", "lo"};
  o.flags.insert(o.flags.end(), extra.begin(), extra.end());
  return oscarkv::testing::LocalDaemon::Start(o);
}

inline absl::StatusOr<std::unique_ptr<client::HandleClient>> Connect(const std::string& address,
                                                                     client::DataPath path,
                                                                     bool verify = true) {
  client::ConnectOptions o;
  o.address = address;
  o.data_path = path;
  o.verify_checksums = verify;
  o.dedicated_connection = true;
  return client::HandleClient::Connect(o);
}

}  // namespace oscarkv::pd::testing
