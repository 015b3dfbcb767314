// Caller: who makes a PageCache call. Every front end (gRPC, the local socket) builds one per
// call and passes it first to every PageCache method that reads or changes cache state.
//
// Today every front end passes a default Caller (no tenant, admin): the cache does not enforce
// ownership yet. A front end that authenticates its peer (TLS client certificate, SO_PEERCRED)
// fills `tenant` and clears `admin`; the cache may then scope what the caller sees and changes.
#pragma once

#include <string>

namespace oscarkv::service {

struct Caller {
  // The tenant the call acts for ("" = no tenant: the node's shared namespace).
  std::string tenant;
  // May act on every tenant's pages and on node-wide state (Clear without a codec, Stats).
  bool admin = true;
};

}  // namespace oscarkv::service
