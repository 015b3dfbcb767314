#include "tenant_identity.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>

namespace oscarkv::service {

std::vector<std::string> CertificateNames(const grpc::AuthContext* auth) {
  std::vector<std::string> names;
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  auto add = [&](const grpc::string_ref& v) {
    std::string s(v.data(), v.size());
    if (!s.empty() && std::find(names.begin(), names.end(), s) == names.end()) {
      names.push_back(std::move(s));
    }
  };
  for (const auto& v : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) add(v);
  for (const auto& v : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) add(v);
  // Older gRPCs list URI SANs only among every SAN (DNS names, IPs too): take the URIs.
  for (const auto& v : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    const std::string s(v.data(), v.size());
    if (s.find("://") != std::string::npos) add(v);
  }
  return names;
}

}  // namespace oscarkv::service
