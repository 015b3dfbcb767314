// Session: what a Client holds of one oscarkvd instance -- its handshake (ServerInfo), the pool
// mapped here (trusted) or the staging connection (isolated), the load path, the local control
// channel. A daemon restarted behind the same address is a new instance: none of these can be
// used with it (the pool is another memfd, the connections are closed, the socket answers for
// another instance), so the Client replaces its Session as a whole on its next call
// (client.cc, Current()); calls still running on the old one finish on it (shared_ptr).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

class LocalChannel;
class PageSource;
class RpcCore;
class ShmMapping;
class ShmStaging;

struct Session {
  ServerInfo server;
  std::unique_ptr<ShmMapping> shm;       // trusted mode: the pool file, read-write
  std::unique_ptr<ShmStaging> staging;   // isolated mode: read-only pool + staging
  // The load data path: the pool mapped here, a tenant's load staging (ShmLoadStaging), or gRPC.
  // Declared after what it reads from, so it is destroyed first.
  std::unique_ptr<PageSource> source;
  std::shared_ptr<LocalChannel> local;   // set: Lookup/Release go over the local socket

  ~Session();
  // The pool as mapped here (null when it is not).
  const ShmMapping* pool() const;
  // Its daemon instance is gone: the local channel met another instance (or none) at its path,
  // or, with `probe`, a connection of its own (staging, load staging) was closed by the daemon
  // (one poll each; no system call without `probe`). Sessions without a same-host connection
  // cannot tell and are never stale.
  bool Stale(bool probe) const;
};

// Handshakes over `rpc` and opens what `options` ask for on this host (the local socket, shared
// memory); the errors Client::Connect documents.
absl::StatusOr<std::shared_ptr<Session>> OpenSession(RpcCore& rpc, const ConnectOptions& options);

}  // namespace oscarkv::client
