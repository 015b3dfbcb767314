// `oscarkv bench service --tls`: a throwaway PKI for the mutual-TLS daemon, made by the openssl
// tool (as an operator would) in a private temp dir that goes away with it.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/util/subprocess.h"
#include "service_bench_internal.h"

namespace oscarkv::bench::service_bench {

namespace {

absl::Status Openssl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "openssl");
  SpawnOptions o(std::move(args));
  o.search_path = true;
  o.stdout_mode = Stdio::kNull;
  o.stderr_path = dir + "/openssl.log";
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) return p.status();
  auto code = (*p)->Wait(absl::Seconds(60));
  if (!code.ok()) return code.status();
  if (*code != 0) {
    std::ifstream log(dir + "/openssl.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return absl::InternalError(absl::StrCat("openssl ", o.argv[1], " failed: ", text));
  }
  return absl::OkStatus();
}

}  // namespace

BenchPki::~BenchPki() {
  std::error_code ec;
  if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

absl::StatusOr<std::unique_ptr<BenchPki>> MakeBenchPki() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/oscarkv-bench-tls-XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", templ));
  }
  auto pki = std::make_unique<BenchPki>();
  pki->dir = templ;
  const std::string& d = pki->dir;
  std::ofstream(d + "/san.cnf") << "subjectAltName = IP:127.0.0.1\n";
  // P-256 keys: what a deployment would pick for TLS 1.3 handshakes (gRPC's default suites).
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  auto req = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"req"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), ec.begin(), ec.end());
    return a;
  };
  OSCARKV_RETURN_IF_ERROR(Openssl(d, req({"-x509", "-days", "1", "-subj", "/CN=bench-ca",
                                          "-keyout", d + "/ca.key", "-out", d + "/ca.pem"})));
  struct Leaf {
    const char* name;
    const char* subj;
    bool server;
  };
  int serial = 2;
  for (const Leaf& l : {Leaf{"server", "/CN=127.0.0.1", true}, Leaf{"client", "/CN=bench", false}}) {
    const std::string base = absl::StrCat(d, "/", l.name);
    OSCARKV_RETURN_IF_ERROR(
        Openssl(d, req({"-subj", l.subj, "-keyout", base + ".key", "-out", base + ".csr"})));
    std::vector<std::string> sign = {"x509", "-req", "-in", base + ".csr", "-CA", d + "/ca.pem",
                                     "-CAkey", d + "/ca.key", "-set_serial",
                                     std::to_string(serial++), "-days", "1", "-out",
                                     base + ".pem"};
    if (l.server) sign.insert(sign.end(), {"-extfile", d + "/san.cnf"});
    OSCARKV_RETURN_IF_ERROR(Openssl(d, sign));
  }
  pki->ca = d + "/ca.pem";
  pki->server_cert = d + "/server.pem";
  pki->server_key = d + "/server.key";
  pki->client_cert = d + "/client.pem";
  pki->client_key = d + "/client.key";
  return pki;
}

}  // namespace oscarkv::bench::service_bench
