// The gRPC channel credentials of a ConnectOptions: TLS (with a client certificate for mTLS)
// when tls_ca_file is set, else plaintext.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

// Reads the PEM files (errors name the file) and sets the server-name override in *args when
// tls_server_name is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ConnectOptions& options, grpc::ChannelArguments* args);

// For channels opened after Connect succeeded with the same options: on an error (a file gone
// since) TLS credentials that fail every handshake, never a fall back to plaintext.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsOrFail(const ConnectOptions& options,
                                                                   grpc::ChannelArguments* args);

}  // namespace oscarkv::client
