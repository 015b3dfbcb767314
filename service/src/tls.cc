#include "tls.h"

#include <fcntl.h>
#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "oscarkv/service/log.h"

namespace oscarkv::service {

namespace {

// gRPC's watcher re-reads the staged files this often (its minimum).
constexpr unsigned kStageRefreshSeconds = 1;
// Generations kept on disk: the watcher may be reading the previous one while a new one lands.
constexpr uint64_t kKeptGenerations = 3;

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
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::string AsnTime(const ASN1_TIME* t) {
  Bio b(BIO_new(BIO_s_mem()));
  if (b == nullptr || ASN1_TIME_print(b.get(), t) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string DescribeCert(X509* x) {
  char cn[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn)) < 0) {
    cn[0] = '\0';
  }
  std::string serial = "?";
  if (BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), nullptr)) {
    if (char* hex = BN_bn2hex(bn)) {
      serial = hex;
      OPENSSL_free(hex);
    }
    BN_free(bn);
  }
  return absl::StrCat("CN=", cn, " serial=", serial, " not_after=", AsnTime(X509_get0_notAfter(x)));
}

// Writes `bytes` to a new file of mode 0600 whose mtime is `mtime` (whole seconds).
absl::Status WriteStaged(const std::string& path, const std::string& bytes, int64_t mtime) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("tls: cannot create ", path, ": ", strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("tls: cannot write ", path, ": ", strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  const timespec times[2] = {{static_cast<time_t>(mtime), 0}, {static_cast<time_t>(mtime), 0}};
  const bool timed = futimens(fd, times) == 0;
  const int e = errno;
  close(fd);
  if (!timed) return absl::InternalError(absl::StrCat("tls: cannot set the time of ", path, ": ", strerror(e)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerTls::Material> ServerTls::ReadMaterial() const {
  Material m;
  auto cert = ReadPem("certificate", cert_path_);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("key", key_path_);
  if (!key.ok()) return key.status();
  X509Ptr x(PEM_read_bio_X509(MemBio(*cert).get(), nullptr, nullptr, nullptr));
  if (x == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tls: ", cert_path_, " holds no PEM certificate"));
  }
  std::unique_ptr<EVP_PKEY, KeyDeleter> k(
      PEM_read_bio_PrivateKey(MemBio(*key).get(), nullptr, nullptr, nullptr));
  if (k == nullptr || X509_check_private_key(x.get(), k.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: ", key_path_, " is not an unencrypted PEM private key of ", cert_path_));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x.get())) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: ", cert_path_, " expired (not after ", AsnTime(X509_get0_notAfter(x.get())), ")"));
  }
  m.description = DescribeCert(x.get());
  m.cert = *std::move(cert);
  m.key = *std::move(key);
  if (!ca_path_.empty()) {
    auto ca = ReadPem("client CA", ca_path_);
    if (!ca.ok()) return ca.status();
    if (X509Ptr c(PEM_read_bio_X509(MemBio(*ca).get(), nullptr, nullptr, nullptr)); c == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls: ", ca_path_, " holds no PEM certificate"));
    }
    m.ca = *std::move(ca);
  }
  return m;
}

// One generation: <stage>/g<N>/{cert,key,ca}.pem, then the symlink <stage>/current swapped to
// it by rename (atomic). gRPC's watcher compares the files' whole-second mtimes before and after
// reading key and certificate and retries when they moved; every generation gets an mtime
// strictly above the last one, so it can never pair one generation's key with another's
// certificate.
absl::Status ServerTls::Stage(const Material& m) {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  const int64_t mtime = std::max(now, last_mtime_ + 1);
  const uint64_t gen = generation_ + 1;
  const std::string dir = absl::StrCat(stage_dir_, "/g", gen);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (mkdir(dir.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("tls: cannot create ", dir, ": ", strerror(errno)));
  }
  absl::Status s = WriteStaged(dir + "/cert.pem", m.cert, mtime);
  if (s.ok()) s = WriteStaged(dir + "/key.pem", m.key, mtime);
  if (s.ok() && !m.ca.empty()) s = WriteStaged(dir + "/ca.pem", m.ca, mtime);
  const std::string link = stage_dir_ + "/current";
  const std::string tmp = link + ".new";
  unlink(tmp.c_str());
  if (s.ok() && symlink(absl::StrCat("g", gen).c_str(), tmp.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("tls: cannot link ", tmp, ": ", strerror(errno)));
  }
  if (s.ok() && rename(tmp.c_str(), link.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("tls: cannot rename ", tmp, ": ", strerror(errno)));
  }
  if (!s.ok()) {
    std::filesystem::remove_all(dir, ec);
    return s;
  }
  generation_ = gen;
  last_mtime_ = mtime;
  installed_ = m;
  if (gen > kKeptGenerations) {
    std::filesystem::remove_all(absl::StrCat(stage_dir_, "/g", gen - kKeptGenerations), ec);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServerTls>> ServerTls::Create(const DaemonConfig& config,
                                                             const std::string& stage_dir) {
  std::unique_ptr<ServerTls> t(new ServerTls);
  if (config.tls_cert.empty()) {
    t->credentials_ = grpc::InsecureServerCredentials();
    return t;
  }
  t->cert_path_ = config.tls_cert;
  t->key_path_ = config.tls_key;
  t->ca_path_ = config.tls_client_ca;
  auto m = t->ReadMaterial();
  if (!m.ok()) return m.status();

  if (stage_dir.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string templ = absl::StrCat(tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp",
                                     "/oscarkvd-tls-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("tls: cannot create ", templ, ": ", strerror(errno)));
    }
    t->stage_dir_ = templ;
  } else {
    std::error_code ec;
    std::filesystem::remove_all(stage_dir, ec);  // a killed daemon's copies
    if (mkdir(stage_dir.c_str(), 0700) != 0) {
      return absl::InternalError(
          absl::StrCat("tls: cannot create ", stage_dir, ": ", strerror(errno)));
    }
    t->stage_dir_ = stage_dir;
  }
  {
    absl::MutexLock lock(&t->mu_);
    if (absl::Status s = t->Stage(*m); !s.ok()) return s;
  }

  const std::string cur = t->stage_dir_ + "/current/";
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (t->ca_path_.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        cur + "key.pem", cur + "cert.pem", kStageRefreshSeconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        cur + "key.pem", cur + "cert.pem", cur + "ca.pem", kStageRefreshSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_identity_key_cert_pairs();
  if (t->ca_path_.empty()) {
    o.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    t->mode_ = "tls";
  } else {
    o.watch_root_certs();
    o.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    t->mode_ = "mtls";
  }
  t->credentials_ = grpc::experimental::TlsServerCredentials(o);
  if (t->credentials_ == nullptr) return absl::InternalError("tls: gRPC made no server credentials");
  return t;
}

ServerTls::~ServerTls() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
  if (!stage_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(stage_dir_, ec);
  }
}

std::string ServerTls::Describe() const {
  absl::MutexLock lock(&mu_);
  return installed_.description;
}

absl::StatusOr<bool> ServerTls::Reload() {
  if (cert_path_.empty()) return false;
  // Read and check outside the lock (files up to 3 MiB); stage under it.
  auto m = ReadMaterial();
  if (!m.ok()) return m.status();
  absl::MutexLock lock(&mu_);
  if (*m == installed_) return false;
  if (absl::Status s = Stage(*m); !s.ok()) return s;
  return true;
}

void ServerTls::ReloadAndLog(std::string_view trigger) {
  if (cert_path_.empty()) {
    if (trigger == "SIGHUP") {
      LogEvent(LogLevel::kInfo, "tls_reload", {{"trigger", std::string(trigger)},
                                              {"result", "TLS is off: nothing to reload"}});
    }
    return;
  }
  auto r = Reload();
  if (!r.ok()) {
    LogEvent(LogLevel::kError, "tls_reload_failed",
             {{"trigger", std::string(trigger)},
              {"error", std::string(r.status().message())},
              {"serving", Describe()}});
  } else if (*r) {
    LogEvent(LogLevel::kInfo, "tls_reloaded",
             {{"trigger", std::string(trigger)}, {"serving", Describe()}});
  } else if (trigger == "SIGHUP") {
    LogEvent(LogLevel::kInfo, "tls_reload",
             {{"trigger", std::string(trigger)}, {"result", "unchanged"}, {"serving", Describe()}});
  }
}

void ServerTls::WatchFiles(absl::Duration interval) {
  if (cert_path_.empty() || watcher_.joinable()) return;
  watcher_ = std::thread([this, interval] {
    // A bad set is logged once, not every interval, until the files change again.
    std::string last_error;
    while (!stop_.WaitForNotificationWithTimeout(interval)) {
      auto r = Reload();
      if (!r.ok()) {
        const std::string e(r.status().message());
        if (e != last_error) {
          LogEvent(LogLevel::kError, "tls_reload_failed",
                   {{"trigger", "change"}, {"error", e}, {"serving", Describe()}});
        }
        last_error = e;
        continue;
      }
      last_error.clear();
      if (*r) {
        LogEvent(LogLevel::kInfo, "tls_reloaded", {{"trigger", "change"}, {"serving", Describe()}});
      }
    }
  });
}

}  // namespace oscarkv::service
