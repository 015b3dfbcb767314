// The store path of the client library (Client::Store): client-side checks, Reserve, the page
// bytes into their slots (shared memory: copied and hashed in one pass; or WritePages), Commit,
// and Abort of whatever was reserved and not committed. A page is reported as cached only when
// the daemon committed it (OK) or had committed it before (ALREADY_EXISTS).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

class RpcCore;
class ShmMapping;

struct StoreTarget {
  const RpcCore& rpc;
  const ShmMapping* shm;  // null: the gRPC data path
  uint32_t max_batch;     // the daemon's
  const ConnectOptions& options;
};

absl::StatusOr<StoreResult> StorePages(const StoreTarget& target, const Codec& codec,
                                       std::span<const PageWrite> pages);

}  // namespace oscarkv::client
