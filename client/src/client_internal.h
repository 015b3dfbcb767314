// What HandleClient and UcxLoader build on, of a Client made by Client::Connect: its RPC core
// and its data path, so that every call of the library goes through one channel per Client and
// every load through one path (page_fetch.h).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

class PageSource;
class RpcCore;
class ShmMapping;

struct ClientCore {
  std::shared_ptr<RpcCore> rpc;
  PageSource* source = nullptr;     // the Client's data path: shared memory or gRPC by key
  const ShmMapping* shm = nullptr;  // null when the pool is not mapped here
  // Keeps `source` and `shm` alive (the Client's session of one daemon instance): a Client that
  // reconnects after a daemon restart does not take them from under a holder of this core.
  std::shared_ptr<const void> keep;
};

// INTERNAL when `c` was not made by Client::Connect.
absl::StatusOr<ClientCore> CoreOf(Client& c);

}  // namespace oscarkv::client
