// Certificate rotation without a restart, against a real daemon: the test rewrites the files the
// daemon was started with (server certificate, key and client CA, all replaced by another CA's),
// then sends SIGHUP (or, with --tls-reload-s, just waits). New connections get the new
// certificate and CA; a connection made before keeps working; a bad new set is logged and the
// last good one keeps serving.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"
#include "tls_pki.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;

// One channel with its own connection (no subchannel shared with other channels).
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& addr, const Pki& pki,
                                          const std::string& trust, const std::string& client) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pki.pem(trust + ".pem");
  o.pem_private_key = pki.pem(client + ".key");
  o.pem_cert_chain = pki.pem(client + ".pem");
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(addr, grpc::SslCredentials(o), args);
}

// A Handshake call on `ch`; *server_cn receives the CN of the certificate the daemon showed.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& ch, std::string* server_cn) {
  auto stub = pb::KvCache::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  pb::HandshakeResponse resp;
  grpc::Status s = stub->Handshake(&ctx, req, &resp);
  server_cn->clear();
  if (s.ok()) {
    for (const auto& v : ctx.auth_context()->FindPropertyValues("x509_common_name")) {
      server_cn->assign(v.data(), v.size());
    }
  }
  return s;
}

class TlsReloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki("tls_reload_test"); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(pki_->ok()) << pki_->log();
    live_ = ::testing::TempDir() + "/tls_reload_live_" + std::to_string(::getpid());
    std::filesystem::create_directories(live_);
    Install("server.pem", "server.pem");
    Install("server.key", "server.key");
    Install("ca.pem", "ca.pem");
    log_ = live_ + "/daemon.log";
  }
  void TearDown() override { std::filesystem::remove_all(live_); }

  // Replaces live/<to> with the PKI's <from> in one rename (as a secret mount or cert-manager
  // does), so the daemon never reads a half-written file.
  void Install(const std::string& from, const std::string& to) {
    const std::string tmp = live_ + "/." + to + ".tmp";
    std::filesystem::copy_file(pki_->path(from), tmp,
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(tmp, live_ + "/" + to);
  }
  void InstallText(const std::string& text, const std::string& to) {
    const std::string tmp = live_ + "/." + to + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, live_ + "/" + to);
  }

  std::unique_ptr<testing::LocalDaemon> Start(const std::string& reload_s) {
    testing::LocalDaemonOptions o;
    o.binary = OSCARKVD_PATH;
    o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--shm-name",
               UniqueShmName("oscarkv-tlsreload", 0), "--tls-cert", live_ + "/server.pem",
               "--tls-key", live_ + "/server.key", "--tls-client-ca", live_ + "/ca.pem",
               "--tls-reload-s", reload_s};
    o.log_path = log_;
    auto d = testing::LocalDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status() << "\n" << ReadFile(log_);
    return d.ok() ? *std::move(d) : nullptr;
  }

  // Fresh connections (rot CA trusted, rot CA's client) until one sees `cn`; bounded at 10 s.
  bool NewConnectionsSee(const std::string& addr, const std::string& trust,
                         const std::string& client, const std::string& cn) {
    for (int i = 0; i < 100; ++i) {
      std::string got;
      if (Call(TlsChannel(addr, *pki_, trust, client), &got).ok() && got == cn) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Polls the daemon's log (bounded at 10 s) for `text`.
  bool LogShows(const std::string& text) {
    for (int i = 0; i < 100; ++i) {
      if (ReadFile(log_).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  static Pki* pki_;
  std::string live_, log_;
};
Pki* TlsReloadTest::pki_ = nullptr;

TEST_F(TlsReloadTest, SighupServesTheRotatedCertificateAndCaToNewConnections) {
  auto d = Start("0");  // SIGHUP only
  ASSERT_NE(d, nullptr);
  const std::string addr = d->address();
  auto old_channel = TlsChannel(addr, *pki_, "ca", "client");
  std::string cn;
  grpc::Status s = Call(old_channel, &cn);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cn, "127.0.0.1");

  // Rotate everything to the "rot" CA: new server certificate (other serial and CN), new key,
  // and a client CA that no longer accepts the old CA's clients.
  Install("server2.pem", "server.pem");
  Install("server2.key", "server.key");
  Install("rot.pem", "ca.pem");
  ASSERT_EQ(kill(d->pid(), SIGHUP), 0);
  EXPECT_TRUE(NewConnectionsSee(addr, "rot", "client2", "127.0.0.1-rotated")) << ReadFile(log_);
  EXPECT_TRUE(LogShows("event=tls_reloaded trigger=SIGHUP serving=\"CN=127.0.0.1-rotated serial=22"))
      << ReadFile(log_);

  // The connection made before the rotation still works, with the certificate it was made with.
  s = Call(old_channel, &cn);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cn, "127.0.0.1");
  // New connections: the old CA's client is refused now, and so is a client trusting the old CA.
  EXPECT_EQ(Call(TlsChannel(addr, *pki_, "rot", "client"), &cn).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(TlsChannel(addr, *pki_, "ca", "client"), &cn).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // A bad new set -- the first certificate back with the rotated key (a half-done rotation),
  // then garbage -- is refused with a log line; the rotated set keeps serving.
  Install("server.pem", "server.pem");
  ASSERT_EQ(kill(d->pid(), SIGHUP), 0);
  EXPECT_TRUE(LogShows("is not an unencrypted PEM private key of " + live_ + "/server.pem"))
      << ReadFile(log_);
  InstallText("not a certificate\n", "server.pem");
  ASSERT_EQ(kill(d->pid(), SIGHUP), 0);
  EXPECT_TRUE(LogShows(live_ + "/server.pem holds no PEM certificate")) << ReadFile(log_);
  // Give gRPC's watcher (1 s) time to pick up anything it wrongly would, then check.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  s = Call(TlsChannel(addr, *pki_, "rot", "client2"), &cn);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cn, "127.0.0.1-rotated");
  EXPECT_TRUE(d->Running());
  auto stopped = d->Stop();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0) << ReadFile(log_);
}

TEST_F(TlsReloadTest, ChangedFilesAreReloadedWithoutASignal) {
  auto d = Start("1");
  ASSERT_NE(d, nullptr);
  std::string cn;
  ASSERT_TRUE(Call(TlsChannel(d->address(), *pki_, "ca", "client"), &cn).ok());
  EXPECT_EQ(cn, "127.0.0.1");
  // One file at a time: a poll between two renames sees a key that does not match the
  // certificate, logs it and keeps the old set until a later poll finds the new set whole.
  Install("server2.key", "server.key");
  Install("server2.pem", "server.pem");
  Install("rot.pem", "ca.pem");
  EXPECT_TRUE(NewConnectionsSee(d->address(), "rot", "client2", "127.0.0.1-rotated"))
      << ReadFile(log_);
  EXPECT_TRUE(LogShows("event=tls_reloaded trigger=change")) << ReadFile(log_);
}

// The checked copies gRPC reads live in <pool file>.tls/ (mode 0700) and go with the daemon: on
// a clean stop; after kill -9 of a default-named daemon, when the next default-named daemon
// clears the dead one's pool file; after LocalDaemon::Kill, with the pool file it removes.
TEST_F(TlsReloadTest, StagedCopiesGoWithTheDaemonEvenAfterKill9) {
  auto start = [&](const std::string& log) {
    testing::LocalDaemonOptions o;
    o.binary = OSCARKVD_PATH;
    o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--tls-cert", live_ + "/server.pem",
               "--tls-key", live_ + "/server.key", "--ucx", "off"};  // no --shm-name: oscarkvd-0-<pid>
    o.log_path = log;
    auto d = testing::LocalDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status() << "\n" << ReadFile(log);
    return d.ok() ? *std::move(d) : nullptr;
  };
  auto first = start(log_);
  ASSERT_NE(first, nullptr);
  const std::string staged = first->shm_path() + ".tls";
  struct stat st {};
  ASSERT_EQ(::stat(staged.c_str(), &st), 0) << staged;
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(std::filesystem::exists(staged + "/current/key.pem"));
  // kill -9 and reap it here, so nothing but the next daemon cleans up after it.
  ASSERT_EQ(::kill(first->pid(), SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(first->pid(), &status, 0), first->pid());
  (void)first->Running();  // its waitpid fails (ECHILD): it marks itself exited, never signals
                           // that (reusable) pid again
  // Left behind, as the pool file is. Any default-named daemon clears dead ones' files when it
  // starts, and other tests start such daemons in parallel (ctest -j): one of them may be the
  // daemon that clears these, so which daemon logs removed_dead_pool is not checked here.
  auto second = start(live_ + "/second.log");
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(std::filesystem::exists(staged)) << ReadFile(live_ + "/second.log");
  const std::string own = second->shm_path() + ".tls";
  EXPECT_TRUE(std::filesystem::exists(own));
  second->Kill(SIGKILL);
  EXPECT_FALSE(std::filesystem::exists(own));
  auto third = start(live_ + "/third.log");
  ASSERT_NE(third, nullptr);
  const std::string third_own = third->shm_path() + ".tls";
  auto stopped = third->Stop();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_FALSE(std::filesystem::exists(third_own));
}

}  // namespace
}  // namespace oscarkv::testing
