// The one RPC core under Client, HandleClient and UcxLoader: the gRPC channel to one daemon, the
// per-call deadline, and the gRPC -> absl::Status adapter. Every control call of the client
// library goes through one of these; no other file dials a channel or sets a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "oscarkv/client/client.h"
#include "oscarkv/proto/grpc_status.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::client {

// grpc::Status -> absl::Status: codes one-to-one, the message prefixed with the call's name
// (the one adapter, in proto/, shared with the daemon's ToGrpc).
using ::oscarkv::FromGrpc;

class RpcCore {
 public:
  // The gRPC metadata key that selects a shared namespace (ConnectOptions::shared_namespace).
  static constexpr const char* kNamespaceMetadata = "oscarkv-namespace";
  // A channel to options.address (gRPC connects lazily, on the first call). One channel (and
  // so one connection) is shared by the Clients of a process dialing the same address with the
  // same TLS files' contents, unless options.dedicated_connection. Calls are
  // never retried transparently; reconnects back off at most 1 s, so a restarted daemon on the
  // same address is reached again quickly.
  static std::shared_ptr<RpcCore> Dial(const ConnectOptions& options);

  v1::KvCache::Stub& stub() const { return *stub_; }
  // A context whose deadline is rpc_timeout_ms from now (one per call).
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
    if (!shared_namespace_.empty()) ctx->AddMetadata(kNamespaceMetadata, shared_namespace_);
    return ctx;
  }
  const std::string& address() const { return address_; }
  int64_t timeout_ms() const { return timeout_ms_; }

 private:
  RpcCore(std::shared_ptr<grpc::Channel> channel, std::string address, int64_t timeout_ms,
          std::string shared_namespace)
      : channel_(std::move(channel)),
        stub_(v1::KvCache::NewStub(channel_)),
        address_(std::move(address)),
        timeout_ms_(timeout_ms),
        shared_namespace_(std::move(shared_namespace)) {}

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  const std::string address_;
  const int64_t timeout_ms_;
  const std::string shared_namespace_;
};

}  // namespace oscarkv::client
