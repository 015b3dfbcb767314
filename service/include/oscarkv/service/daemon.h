// The oscarkvd process: builds the shared-memory pool, the PageCache, the gRPC server (KvCache +
// grpc.health.v1 + server reflection), the Prometheus endpoint and the reaper thread from a
// DaemonConfig; prints the ready line; waits for SIGTERM/SIGINT; then drains and cleans up.
#pragma once

#include "absl/status/status.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {

// Blocks SIGTERM/SIGINT in the calling thread (call before any thread starts, so every thread
// inherits the mask and RunDaemon can sigwait for them) and ignores SIGPIPE.
void BlockTerminationSignals();

// Runs until SIGTERM or SIGINT. OK after a clean drain; an error if startup fails (port in
// use, pool too large, ...), after undoing what was set up (the pool file is removed).
// Meant to be the last thing a process does: after a drain the gRPC server object is not
// destroyed (see daemon.cc), and the caller should exit promptly.
absl::Status RunDaemon(const DaemonConfig& config);

}  // namespace oscarkv::service
