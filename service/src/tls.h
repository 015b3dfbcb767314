// oscarkvd's gRPC server credentials: TLS from the configured PEM files (mTLS with a client
// CA), or plaintext when none is configured (DaemonConfig::Validate refuses plaintext on a
// non-loopback address unless allowed).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {

struct ServerTls {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string mode;  // "off", "tls" or "mtls" (for the ready log line)
};

// Reads and checks the files before gRPC sees them, so a bad one is a startup error that names
// it: each must be PEM, the key must match the certificate, the CA bundle must hold at least
// one certificate.
absl::StatusOr<ServerTls> MakeServerTls(const DaemonConfig& config);

}  // namespace oscarkv::service
