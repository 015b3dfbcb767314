// Caller: who makes a PageCache call. Every front end (gRPC, the local socket) builds one per
// call and passes it first to every PageCache method that reads or changes cache state.
//
// The front ends authenticate their peer (gRPC: the TLS client certificate; the local socket:
// SO_PEERCRED) and fill the Caller from the daemon's TenantRegistry; the cache scopes what the
// caller sees and changes to its namespace and charges what it holds to its tenant's quotas.
#pragma once

#include <string>

namespace oscarkv::service {

struct Caller {
  // The tenant the call acts for ("" = no tenant: the node's shared namespace).
  std::string tenant;
  // May act on every tenant's pages and on node-wide state (Clear without a codec, Stats).
  bool admin = true;
  // Filled by the front ends from the TenantRegistry (tenants.h): the tenant's id, and the
  // namespace whose codecs and keys the call uses (the tenant's own -- the same id -- or a shared
  // namespace it selected). A default Caller is tenant 0 in namespace 0: the single default
  // tenant of a daemon without tenants.
  uint32_t tenant_id = 0;
  uint32_t ns = 0;
};

}  // namespace oscarkv::service
