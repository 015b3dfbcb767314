// RAII owners for raw UCX (ucp) handles, and the one ucs_status_t -> absl::Status adapter.
//
// Every UCX handle this library creates lives in one of these unique_ptrs, so an early return
// or an error path can never leak a context, worker, endpoint, registration, rkey or request.
// Destruction order is the owner's job: rkeys and requests before their endpoint, endpoints
// before their worker, registrations and workers before their context (the classes in
// transport.h hold these in that order).
#pragma once

#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "absl/status/status.h"

namespace oscarkv::transport {

// Maps a UCX status to an absl::Status carrying `what` and UCX's own message. Connection-level
// failures (reset, unreachable, endpoint timeout, canceled) map to UNAVAILABLE, bad arguments to
// INVALID_ARGUMENT, missing resources/features to UNIMPLEMENTED or RESOURCE_EXHAUSTED, timeouts
// to DEADLINE_EXCEEDED; everything else to INTERNAL. UCS_OK maps to OkStatus.
absl::Status FromUcs(ucs_status_t status, const std::string& what);

struct UcpConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
struct UcpContextDeleter {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct UcpWorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
// A worker address as returned by ucp_worker_get_address; needs its worker to release it.
struct UcpWorkerAddressDeleter {
  ucp_worker_h worker = nullptr;
  void operator()(ucp_address_t* a) const { ucp_worker_release_address(worker, a); }
};
// Registered memory; needs its context to unmap it.
struct UcpMemDeleter {
  ucp_context_h context = nullptr;
  void operator()(ucp_mem* m) const { ucp_mem_unmap(context, m); }
};
struct UcpRkeyDeleter {
  void operator()(ucp_rkey* k) const { ucp_rkey_destroy(k); }
};
struct UcpRkeyBufferDeleter {
  void operator()(void* p) const { ucp_rkey_buffer_release(p); }
};
// A request returned by a *_nbx call. Freeing an uncompleted request is allowed by UCX (it is
// released on completion), but its callback still runs: owners must make sure the callback's
// user data outlives it (Transfer does, by forcing its endpoint closed first).
struct UcpRequestDeleter {
  void operator()(void* r) const { ucp_request_free(r); }
};

using UcpConfigPtr = std::unique_ptr<ucp_config_t, UcpConfigDeleter>;
using UcpContextPtr = std::unique_ptr<ucp_context, UcpContextDeleter>;
using UcpWorkerPtr = std::unique_ptr<ucp_worker, UcpWorkerDeleter>;
using UcpWorkerAddressPtr = std::unique_ptr<ucp_address_t, UcpWorkerAddressDeleter>;
using UcpMemPtr = std::unique_ptr<ucp_mem, UcpMemDeleter>;
using UcpRkeyPtr = std::unique_ptr<ucp_rkey, UcpRkeyDeleter>;
using UcpRkeyBufferPtr = std::unique_ptr<void, UcpRkeyBufferDeleter>;
using UcpRequestPtr = std::unique_ptr<void, UcpRequestDeleter>;

}  // namespace oscarkv::transport
