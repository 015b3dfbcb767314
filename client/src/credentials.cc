#include "credentials.h"

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

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

// gRPC shares a connection (subchannel) between channels only when their credentials compare
// equal, and it compares TLS credentials by object: a Client that made its own SslCredentials
// would open its own TCP connection and TLS handshake even without dedicated_connection, where
// plaintext Clients of one process share one. So Clients with the same CA, certificate and key
// (by content: a reloaded file makes new credentials) get the same object while any holds it.
std::shared_ptr<grpc::ChannelCredentials> SharedSslCredentials(
    const grpc::SslCredentialsOptions& o) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::tuple<std::string, std::string, std::string>,
                                    std::weak_ptr<grpc::ChannelCredentials>>();
  absl::MutexLock lock(&mu);
  for (auto it = cache->begin(); it != cache->end();) {  // forget credentials nobody holds
    it = it->second.expired() ? cache->erase(it) : std::next(it);
  }
  auto& slot = (*cache)[{o.pem_root_certs, o.pem_cert_chain, o.pem_private_key}];
  if (auto held = slot.lock()) return held;
  std::shared_ptr<grpc::ChannelCredentials> made = grpc::SslCredentials(o);
  slot = made;
  return made;
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
  if (options.dedicated_connection) return grpc::SslCredentials(o);
  return SharedSslCredentials(o);
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
