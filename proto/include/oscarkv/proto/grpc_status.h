// The one grpc::Status <-> absl::Status adapter, for the client (FromGrpc on every RPC's result)
// and the daemon (ToGrpc on every handler's result). The two enums share their numbering, so
// codes map one-to-one; the message is kept (FromGrpc prefixes it with the call's name).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace oscarkv {

// OK stays OK; otherwise the same code with "<what>: <message>" (just the message when `what`
// is empty).
absl::Status FromGrpc(const grpc::Status& s, absl::string_view what = {});
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace oscarkv
