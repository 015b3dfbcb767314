// gRPC over TLS against a real daemon, with a throwaway CA and certificates made by the openssl
// tool at test time: a client certificate of the configured CA is served; no certificate,
// another CA's certificate, an expired certificate and plaintext are refused; without TLS a
// non-loopback listen address is refused at start unless plaintext is allowed explicitly.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "run_tool.h"
#include "test_util.h"
#include "tls_pki.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;

// Handshake over a TLS channel presenting `client` ("" = no client certificate).
grpc::Status Handshake(const std::string& addr, const Pki& pki, const std::string& client) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pki.pem("ca.pem");
  if (!client.empty()) {
    o.pem_private_key = pki.pem(client + ".key");
    o.pem_cert_chain = pki.pem(client + ".pem");
  }
  auto stub = pb::KvCache::NewStub(grpc::CreateChannel(addr, grpc::SslCredentials(o)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  pb::HandshakeResponse resp;
  return stub->Handshake(&ctx, req, &resp);
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki("tls_test"); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(pki_->ok()) << pki_->log(); }
  static Pki* pki_;
};
Pki* TlsTest::pki_ = nullptr;

TEST_F(TlsTest, MutualTlsAdmitsOnlyTheConfiguredCasClients) {
  auto d = StartDaemon({"--tls-cert", pki_->path("server.pem"), "--tls-key",
                        pki_->path("server.key"), "--tls-client-ca", pki_->path("ca.pem")});
  ASSERT_NE(d, nullptr);
  const std::string addr = d->address();
  grpc::Status s = Handshake(addr, *pki_, "client");
  EXPECT_TRUE(s.ok()) << s.error_message();
  for (const char* refused : {"", "stranger", "expired"}) {
    s = Handshake(addr, *pki_, refused);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << "client certificate '" << refused << "': " << s.error_message();
  }
  // Plaintext to a TLS port.
  auto plain = pb::KvCache::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  pb::HandshakeResponse resp;
  EXPECT_FALSE(plain->Handshake(&ctx, req, &resp).ok());
}

TEST_F(TlsTest, TlsWithoutClientCaServesAnyClient) {
  auto d = StartDaemon({"--tls-cert", pki_->path("server.pem"), "--tls-key",
                        pki_->path("server.key")});
  ASSERT_NE(d, nullptr);
  grpc::Status s = Handshake(d->address(), *pki_, "");
  EXPECT_TRUE(s.ok()) << s.error_message();
}

client::ConnectOptions TlsOptions(const std::string& addr, const Pki& pki,
                                  const std::string& client) {
  client::ConnectOptions o;
  o.address = addr;
  o.rpc_timeout_ms = 5000;
  o.tls_ca_file = pki.path("ca.pem");
  if (!client.empty()) {
    o.tls_cert_file = pki.path(client + ".pem");
    o.tls_key_file = pki.path(client + ".key");
  }
  return o;
}

// The client library's TLS options against the mTLS daemon: a page stored and looked up over
// TLS; without a certificate, with another CA's or in plaintext Connect fails.
TEST_F(TlsTest, ClientLibraryConnectsOverMutualTls) {
  auto d = StartDaemon({"--tls-cert", pki_->path("server.pem"), "--tls-key",
                        pki_->path("server.key"), "--tls-client-ca", pki_->path("ca.pem")});
  ASSERT_NE(d, nullptr);
  auto c = client::Client::Connect(TlsOptions(d->address(), *pki_, "client"));
  ASSERT_TRUE(c.ok()) << c.status();
  client::Codec codec = RegisterRefmodel(**c);
  const std::vector<uint32_t> tokens = Tokens(7, codec.profile.page_tokens);
  const auto keys = client::Client::BlockKeys(codec, tokens);
  ASSERT_EQ(keys.size(), 1u);
  const std::vector<uint8_t> page = MakePage(codec.profile, PageKind::kInt2, 7);
  const std::vector<client::PageWrite> writes = {{keys[0], PageKind::kInt2, page}};
  auto stored = (*c)->Store(codec, writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 1u);
  auto found = (*c)->Lookup(codec, keys);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->matched, 1u);

  for (const char* refused : {"", "stranger", "expired"}) {
    auto r = client::Client::Connect(TlsOptions(d->address(), *pki_, refused));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
        << "certificate '" << refused << "': " << r.status();
  }
  client::ConnectOptions plain;
  plain.address = d->address();
  plain.rpc_timeout_ms = 5000;
  EXPECT_FALSE(client::Client::Connect(plain).ok());
  client::ConnectOptions missing = TlsOptions(d->address(), *pki_, "client");
  missing.tls_key_file = pki_->path("missing.key");
  auto m = client::Client::Connect(missing);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
}

// The C ABI (liboscarkv_c.so) against the mTLS daemon: client_c_abi_test ADDR --tls DIR.
TEST_F(TlsTest, CAbiConnectsOverMutualTls) {
  auto d = StartDaemon({"--tls-cert", pki_->path("server.pem"), "--tls-key",
                        pki_->path("server.key"), "--tls-client-ca", pki_->path("ca.pem")});
  ASSERT_NE(d, nullptr);
  const std::string dir = pki_->path("");
  std::string out;
  EXPECT_EQ(RunTool(OSCARKV_C_ABI_TEST_PATH, d->address() + " --tls " + dir, &out), 0) << out;
}

#ifdef OSCARKV_CLI_PATH
// `oscarkv <args>`: the exit code; stdout and stderr together in *out.
int RunCli(const std::string& args, std::string* out) {
  return RunTool(OSCARKV_CLI_PATH, args, out);
}

// The operator commands of the `oscarkv` tool with --tls-ca/--tls-cert/--tls-key.
TEST_F(TlsTest, CliOperatorCommandsOverMutualTls) {
  auto d = StartDaemon({"--tls-cert", pki_->path("server.pem"), "--tls-key",
                        pki_->path("server.key"), "--tls-client-ca", pki_->path("ca.pem")});
  ASSERT_NE(d, nullptr);
  const std::string addr = " --addr " + d->address() + " --tls-ca " + pki_->path("ca.pem");
  const std::string mine = " --tls-cert " + pki_->path("client.pem") + " --tls-key " +
                           pki_->path("client.key");
  std::string out;
  EXPECT_EQ(RunCli("health" + addr + mine, &out), 0) << out;
  EXPECT_EQ(RunCli("stats --json" + addr + mine, &out), 0) << out;
  EXPECT_NE(out.find("\"pool_bytes\""), std::string::npos) << out;
  // Refused: no client certificate, another CA's, plaintext.
  EXPECT_EQ(RunCli("health" + addr, &out), 1) << out;
  EXPECT_NE(out.find("UNAVAILABLE"), std::string::npos) << out;
  EXPECT_EQ(RunCli("health" + addr + " --tls-cert " + pki_->path("stranger.pem") + " --tls-key " +
                       pki_->path("stranger.key"),
                   &out),
            1)
      << out;
  EXPECT_EQ(RunCli("health --addr " + d->address(), &out), 1) << out;
  // Usage errors before anything is sent.
  EXPECT_EQ(RunCli("health" + addr + " --tls-cert " + pki_->path("client.pem"), &out), 2) << out;
  EXPECT_NE(out.find("--tls-cert and --tls-key go together"), std::string::npos) << out;
  EXPECT_EQ(RunCli("health --addr " + d->address() + mine, &out), 2) << out;
  EXPECT_EQ(RunCli("health --help", &out), 0) << out;
  EXPECT_NE(out.find("--tls-ca"), std::string::npos) << out;
}
#endif

// The UCX pool key reads every tenant's pages: with tenants configured GetDataPlane gives it to
// an admin, and a tenant a data plane of its own (staged; ucx_tenant_test) -- unless
// ucx.share_pool_key: true.
// With tenants the whole-pool data plane (UCX's emulated RMA checks no key) runs only on request:
// share_pool_key hands its key to every tenant, allow_unverified_rma keeps it for admins; by
// default no process maps the pool for UCX and admins, like tenants, get staged data planes of
// their own.
TEST_F(TlsTest, PoolKeyGoesOnlyToAdminsWhenTenantsAreConfigured) {
  enum class Mode { kDefault, kShare, kAdminsOnly };
  for (const Mode mode : {Mode::kDefault, Mode::kShare, Mode::kAdminsOnly}) {
    const bool share = mode == Mode::kShare;
    const bool allow = mode == Mode::kAdminsOnly;
    const std::string cfg = pki_->path("tenants_" + std::to_string(static_cast<int>(mode)) + ".yaml");
    std::ofstream(cfg) << "tls:\n  cert: " << pki_->path("server.pem") << "\n  key: "
                       << pki_->path("server.key") << "\n  client_ca: " << pki_->path("ca.pem")
                       << "\nucx:\n  share_pool_key: " << (share ? "true" : "false")
                       << "\n  allow_unverified_rma: " << (allow ? "true" : "false")
                       << "\ntenants:\n  - name: tenant-client\n  - name: tenant-admin\n"
                          "    role: admin\n";
    SCOPED_TRACE(cfg);
    auto d = StartDaemon({"--config", cfg});
    ASSERT_NE(d, nullptr);
    auto get = [&](const std::string& who, pb::GetDataPlaneResponse* resp) {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs = pki_->pem("ca.pem");
      o.pem_private_key = pki_->pem(who + ".key");
      o.pem_cert_chain = pki_->pem(who + ".pem");
      auto stub = pb::KvCache::NewStub(grpc::CreateChannel(d->address(), grpc::SslCredentials(o)));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      return stub->GetDataPlane(&ctx, pb::GetDataPlaneRequest(), resp);
    };
    pb::GetDataPlaneResponse admin, tenant;
    grpc::Status s = get("admin", &admin);
    if (mode == Mode::kDefault) {
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_TRUE(admin.staged());
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_FALSE(admin.pool_rkey().empty());
      EXPECT_FALSE(admin.staged());
    }
    s = get("client", &tenant);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (share) {
      EXPECT_EQ(tenant.pool_rkey(), admin.pool_rkey());
    } else {
      EXPECT_TRUE(tenant.staged());
      EXPECT_NE(tenant.pool_rkey(), admin.pool_rkey());
      EXPECT_NE(tenant.worker_address(), admin.worker_address());
    }
  }
}

// Startup errors: the daemon exits 1 with one line that says why (nothing is bound).
std::string FailedStart(const std::vector<std::string>& flags) {
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--shm-name",
             UniqueShmName("oscarkv-tls", 0)};
  o.flags.insert(o.flags.end(), flags.begin(), flags.end());
  o.log_path = ::testing::TempDir() + "/tls_test_start_" + std::to_string(::getpid()) + ".log";
  auto d = testing::LocalDaemon::Start(o);
  EXPECT_FALSE(d.ok()) << "started with " << flags[0];
  const std::string log = ReadFile(o.log_path);
  std::remove(o.log_path.c_str());
  return log;
}

TEST_F(TlsTest, PlaintextOnANonLoopbackAddressIsRefused) {
  const std::string log = FailedStart({"--listen", "0.0.0.0:0"});
  EXPECT_NE(log.find("oscarkvd: refusing plaintext gRPC on 0.0.0.0:0"), std::string::npos) << log;
  EXPECT_NE(log.find("--allow-plaintext"), std::string::npos) << log;
}

// TLS without a client CA asks no client for a certificate: off loopback every client on the
// network would be the admin tenant, so the daemon refuses to start unless told clients are
// trusted. With the opt-in it serves a client that presents no certificate (the risk named).
TEST_F(TlsTest, TlsWithoutClientCaOffLoopbackIsRefusedUnlessAllowed) {
  const std::vector<std::string> tls = {"--listen", "0.0.0.0:0", "--ucx", "off", "--tls-cert",
                                        pki_->path("server.pem"), "--tls-key",
                                        pki_->path("server.key")};
  const std::string log = FailedStart(tls);
  EXPECT_NE(log.find("oscarkvd: refusing TLS without client certificates on 0.0.0.0:0"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("--tls-client-ca"), std::string::npos) << log;
  EXPECT_NE(log.find("--tls-allow-unauthenticated-clients"), std::string::npos) << log;
  EXPECT_NE(log.find("tls.allow_unauthenticated_clients: true"), std::string::npos) << log;

  std::vector<std::string> allowed = tls;
  allowed.push_back("--tls-allow-unauthenticated-clients");
  auto d = StartDaemon(allowed);
  ASSERT_NE(d, nullptr);
  const std::string port = d->address().substr(d->address().rfind(':') + 1);
  grpc::Status s = Handshake("127.0.0.1:" + port, *pki_, "");
  EXPECT_TRUE(s.ok()) << s.error_message();

  // With a client CA the same address starts without the opt-in, and still refuses no-cert.
  std::vector<std::string> mtls = tls;
  mtls.insert(mtls.end(), {"--tls-client-ca", pki_->path("ca.pem")});
  auto m = StartDaemon(mtls);
  ASSERT_NE(m, nullptr);
  const std::string mport = m->address().substr(m->address().rfind(':') + 1);
  EXPECT_EQ(Handshake("127.0.0.1:" + mport, *pki_, "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Handshake("127.0.0.1:" + mport, *pki_, "client").ok());
}

TEST_F(TlsTest, BadTlsFilesAreStartupErrors) {
  std::string log = FailedStart({"--tls-cert", pki_->path("server.pem")});
  EXPECT_NE(log.find("cert and key go together"), std::string::npos) << log;
  log = FailedStart({"--tls-cert", pki_->path("server.pem"), "--tls-key", pki_->path("client.key")});
  EXPECT_NE(log.find("is not an unencrypted PEM private key of " + pki_->path("server.pem")),
            std::string::npos)
      << log;
  log = FailedStart({"--tls-cert", pki_->path("missing.pem"), "--tls-key", pki_->path("server.key")});
  EXPECT_NE(log.find("tls: cannot read certificate " + pki_->path("missing.pem")),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace oscarkv::testing
