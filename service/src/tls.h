// oscarkvd's gRPC server credentials: TLS from the configured PEM files (mTLS with a client
// CA), or plaintext when none is configured (DaemonConfig::Validate refuses plaintext on a
// non-loopback address unless allowed).
//
// Reload. gRPC 1.51 can swap a server's certificates only through a certificate provider, and
// its file watcher installs whatever it reads -- a half-written or mismatched file would break
// every new handshake. So the configured files are never handed to gRPC directly: each set is
// checked first (PEM, key matches certificate, not expired, CA bundle parses) and only then
// copied into a private staging directory that gRPC's FileWatcherCertificateProvider watches
// (it re-reads it every second). A bad new set is refused and the old one keeps serving.
// Existing connections keep the certificate they were made with.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {

class ServerTls {
 public:
  // Reads and checks the files before gRPC sees them, so a bad one is a startup error that
  // names it: each must be PEM, the key must match the certificate (which must not have
  // expired), the CA bundle must hold at least one certificate. TLS off (config.tls_cert empty)
  // gives insecure credentials and no staging directory. `stage_dir` is where the checked
  // copies live: a path this daemon alone owns (anything there is replaced; removed with this
  // object); "" = a fresh directory under $TMPDIR.
  static absl::StatusOr<std::unique_ptr<ServerTls>> Create(const DaemonConfig& config,
                                                           const std::string& stage_dir);
  ~ServerTls();
  ServerTls(const ServerTls&) = delete;
  ServerTls& operator=(const ServerTls&) = delete;

  const std::shared_ptr<grpc::ServerCredentials>& credentials() const { return credentials_; }
  const std::string& mode() const { return mode_; }  // "off", "tls" or "mtls"
  // "CN=... serial=... not_after=..." of the certificate new connections get ("" when off).
  std::string Describe() const;

  // Re-reads the configured files. OK(false): unchanged (or TLS off). OK(true): changed and
  // valid -- staged; gRPC serves them to new connections within about a second. An error: a
  // file is bad or unreadable, and what was installed before keeps serving. Thread-safe.
  absl::StatusOr<bool> Reload();
  // Reload() with a log line when something changed or failed; `trigger` names the cause.
  void ReloadAndLog(std::string_view trigger);
  // Reload() every `interval` until this object is destroyed, logging a change and (once per
  // distinct error) a failure. Call once.
  void WatchFiles(absl::Duration interval);

 private:
  struct Material {
    std::string cert, key, ca;
    std::string description;
    bool operator==(const Material& o) const {
      return cert == o.cert && key == o.key && ca == o.ca;
    }
  };
  ServerTls() = default;
  absl::StatusOr<Material> ReadMaterial() const;
  absl::Status Stage(const Material& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string cert_path_, key_path_, ca_path_;  // configured
  std::string stage_dir_;
  std::string mode_ = "off";
  std::shared_ptr<grpc::ServerCredentials> credentials_;

  mutable absl::Mutex mu_;
  Material installed_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mtime_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Notification stop_;
  std::thread watcher_;
};

}  // namespace oscarkv::service
