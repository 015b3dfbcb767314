// The store path of the client library (Client::Store): client-side checks, Reserve, the page
// bytes into their slots (isolated shared memory: through the staging region, copied, hashed
// and committed by the daemon with each page's last chunk; trusted shared memory: copied and
// hashed here in one pass; or WritePages), Commit of what the daemon did not commit yet, and
// Abort of whatever was reserved and not committed. A page is reported as cached only when
// the daemon committed it (OK) or had committed it before (ALREADY_EXISTS).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

class RpcCore;
class ShmMapping;
class ShmStaging;

struct StoreTarget {
  const RpcCore& rpc;
  const ShmMapping* shm;  // null: the gRPC data path
  ShmStaging* staging;    // isolated shared memory: pages go through it (shm is read-only)
  // Reserve on the staging connection (ShmStaging::ReserveAndStage) instead of over gRPC: the
  // daemon serves it and the socket's caller is the one gRPC would act for.
  bool local_reserve;
  uint32_t max_batch;     // the daemon's
  const ConnectOptions& options;
};

absl::StatusOr<StoreResult> StorePages(const StoreTarget& target, const Codec& codec,
                                       std::span<const PageWrite> pages);

}  // namespace oscarkv::client
