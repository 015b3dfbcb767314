// Who a gRPC caller is: the names its verified client certificate offers as a tenant name, read
// from the call's grpc::AuthContext -- the subject CN first, then every URI SAN (e.g. a SPIFFE
// id). Empty when the call carries no verified certificate (plaintext, or TLS without
// tls.client_ca); TenantRegistry::FromCertificate then refuses it when tenants are configured.
#pragma once

#include <string>
#include <vector>

#include "grpcpp/security/auth_context.h"

namespace oscarkv::service {

std::vector<std::string> CertificateNames(const grpc::AuthContext* auth);

}  // namespace oscarkv::service
