// LocalChannel: the client end of oscarkvd's same-host control socket (frames:
// proto/oscarkv/v1/local_control.h). Carries Lookup and Release without gRPC when the daemon is
// on this host.
//
// * Blocking calls (Call) use a pool of connections: take an idle one (or open and handshake a
//   new one), send one frame, block in recv for the answer (SO_RCVTIMEO = the RPC timeout), put
//   the connection back. Two system calls per call, no other thread involved.
// * Non-blocking calls (CallAsync) are pipelined on one connection with request ids; one reader
//   thread receives the answers (in request order) and runs their callbacks. A call not
//   answered within the RPC timeout fails with DEADLINE_EXCEEDED. The reader thread asks the
//   scheduler for a 100 us time slice (Linux >= 6.12) so it runs ahead of CPU-bound threads.
// * Thread-safe. Shared (Open with shared = true) by every Client of this process that talks
//   to the same daemon instance, like gRPC's shared HTTP/2 connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"
#include "oscarkv/v1/local_control.h"

namespace oscarkv::client {

class LocalChannel {
 public:
  // Connects to `path`, handshakes (wire version) and checks that the daemon answering is the
  // instance `expect_instance` the gRPC handshake reached. UNAVAILABLE when nothing serves the
  // path, FAILED_PRECONDITION when someone else does.
  static absl::StatusOr<std::shared_ptr<LocalChannel>> Open(const std::string& path,
                                                            const std::string& client_name,
                                                            uint64_t expect_instance,
                                                            int64_t timeout_ms, bool shared);
  ~LocalChannel();
  LocalChannel(const LocalChannel&) = delete;
  LocalChannel& operator=(const LocalChannel&) = delete;

  // One blocking call; `resp` is filled when the status is OK. `what` prefixes error messages.
  absl::Status Call(v1::local::Method method, const google::protobuf::MessageLite& req,
                    google::protobuf::MessageLite* resp, const char* what);

  // Answer of a CallAsync: the status, and on OK the serialized response message (valid only
  // during the callback). Runs on the reader thread (or the caller's when sending fails).
  using Done = std::function<void(absl::Status, const char* body, size_t body_bytes)>;
  void CallAsync(v1::local::Method method, const google::protobuf::MessageLite& req,
                 const char* what, Done done);

  const std::string& path() const { return path_; }
  // The tenant the daemon serves this process as on the socket (its uid's; "" without tenants):
  // the client uses the socket only when it is the tenant of its gRPC certificate too.
  const std::string& tenant() const { return tenant_; }
  // True once a dial found the instance this channel serves gone (the socket path missing or
  // refusing, or answered by another instance: a restarted daemon). Never false again.
  bool Stale() const { return stale_.load(std::memory_order_relaxed); }
  // A new connection of its own (handshaken, instance checked) for the caller to own and close:
  // the staging connection of isolated shared memory (shm_staging.h).
  absl::StatusOr<int> DialDedicated() { return Dial(timeout_ms_); }

 private:
  LocalChannel(std::string path, std::string client_name, uint64_t instance, int64_t timeout_ms)
      : path_(std::move(path)),
        client_name_(std::move(client_name)),
        instance_(instance),
        timeout_ms_(timeout_ms) {}
  // A connected, handshaken socket.
  absl::StatusOr<int> Dial(int64_t recv_timeout_ms, std::string* tenant = nullptr);
  int TakeIdle();
  void PutIdle(int fd);
  void ReadLoop(int fd);
  // Fails every pending async call of connection `fd` (it broke) with `s`.
  void FailPending(int fd, const absl::Status& s);

  struct Pending {
    uint64_t id;
    int64_t deadline_ns;
    const char* what;
    Done done;
  };

  const std::string path_;
  const std::string client_name_;
  const uint64_t instance_;
  std::string tenant_;  // set once, by Open
  const int64_t timeout_ms_;
  std::atomic<bool> stale_{false};

  // std::mutex, not absl::Mutex: no per-acquisition deadlock-graph work (Debian's Abseil) on a
  // path meant to cost a few microseconds.
  std::mutex idle_mu_;
  std::vector<int> idle_;  // guarded by idle_mu_

  // The async connection. send_mu_ orders sends (ids go out in order) and owns (re)dialing;
  // async_mu_ guards the pending answers and is never held across a system call, so the reader
  // can always drain answers while a sender blocks in send(). Order: send_mu_, then async_mu_.
  std::mutex send_mu_;
  uint64_t next_id_ = 1;  // guarded by send_mu_
  std::mutex async_mu_;   // guards the members below
  int async_fd_ = -1;
  std::deque<Pending> pending_;
  std::vector<std::thread> readers_;
  std::vector<int> dead_fds_;  // broken async connections, closed under send_mu_
  bool closing_ = false;
};

}  // namespace oscarkv::client
