#include "tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"

namespace oscarkv::service {

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tls: cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("tls: ", what, " ", path, " exceeds 1 MiB"));
  }
  return ss.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
Bio MemBio(const std::string& s) { return Bio(BIO_new_mem_buf(s.data(), static_cast<int>(s.size()))); }

}  // namespace

absl::StatusOr<ServerTls> MakeServerTls(const DaemonConfig& config) {
  if (config.tls_cert.empty()) return ServerTls{grpc::InsecureServerCredentials(), "off"};
  auto cert = ReadPem("certificate", config.tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("key", config.tls_key);
  if (!key.ok()) return key.status();

  X509* x = PEM_read_bio_X509(MemBio(*cert).get(), nullptr, nullptr, nullptr);
  if (x == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls: ", config.tls_cert, " holds no PEM certificate"));
  }
  EVP_PKEY* k = PEM_read_bio_PrivateKey(MemBio(*key).get(), nullptr, nullptr, nullptr);
  const bool matches = k != nullptr && X509_check_private_key(x, k) == 1;
  EVP_PKEY_free(k);
  X509_free(x);
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: ", config.tls_key, " is not an unencrypted PEM private key of ", config.tls_cert));
  }

  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  std::string mode = "tls";
  if (!config.tls_client_ca.empty()) {
    auto ca = ReadPem("client CA", config.tls_client_ca);
    if (!ca.ok()) return ca.status();
    X509* c = PEM_read_bio_X509(MemBio(*ca).get(), nullptr, nullptr, nullptr);
    if (c == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls: ", config.tls_client_ca, " holds no PEM certificate"));
    }
    X509_free(c);
    o.pem_root_certs = *ca;
    o.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    mode = "mtls";
  } else {
    o.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
  return ServerTls{grpc::SslServerCredentials(o), mode};
}

}  // namespace oscarkv::service
