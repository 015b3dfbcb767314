#include "credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace oscarkv::client {

namespace {

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("TLS ", what, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, ": ", path, " is not PEM"));
  }
  return ss.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ConnectOptions& options, grpc::ChannelArguments* args) {
  const bool want_tls = !options.tls_ca_file.empty();
  if (!want_tls) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_cert_file/tls_key_file need tls_ca_file (the CA the daemon's certificate chains to)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file go together");
  }
  grpc::SslCredentialsOptions o;
  auto ca = ReadPem("CA", options.tls_ca_file);
  if (!ca.ok()) return ca.status();
  o.pem_root_certs = *ca;
  if (!options.tls_cert_file.empty()) {
    auto cert = ReadPem("certificate", options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("key", options.tls_key_file);
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  if (!options.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsOrFail(const ConnectOptions& options,
                                                                   grpc::ChannelArguments* args) {
  auto c = MakeChannelCredentials(options, args);
  if (c.ok()) return *c;
  grpc::SslCredentialsOptions none;
  none.pem_root_certs = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  return grpc::SslCredentials(none);
}

}  // namespace oscarkv::client
