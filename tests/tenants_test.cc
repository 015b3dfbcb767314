// Tenants against a real daemon: identity from mTLS client certificates (subject CN or URI SAN)
// made by openssl at test time and from local-socket peer credentials (children that setuid to
// mapped uids), isolation of pages, leases and handles between tenants over gRPC and the local
// socket, the admin role, and every quota exhausted by one tenant while another keeps working.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "oscarkv/client/handles.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"
#include "tenant_pki.h"
#include "run_tool.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;
using absl::StatusCode;

constexpr uint32_t kUidA = 64001, kUidB = 64002, kUidStranger = 64003;

// The daemon's tenants. tenant-a's quotas are small so each can be exhausted quickly.
std::string TenantsYaml(const TenantPki& pki) {
  return "tls:\n  cert: " + pki.path("server.pem") + "\n  key: " + pki.path("server.key") +
         "\n  client_ca: " + pki.path("ca.pem") +
         "\ntenants:\n"
         "  - name: tenant-a\n"
         "    quota: {pool_mb: 1, pinned_pages: 16, leases: 4, handles: 2, codecs: 2}\n"
         "    uids: [" + std::to_string(kUidA) + "]\n"
         "  - name: tenant-b\n"
         "    uids: [" + std::to_string(kUidB) + "]\n"
         "  - name: spiffe://oscarkv.test/tenant-c\n"
         "  - name: admin\n"
         "    role: admin\n"
         "shared_namespaces:\n"
         "  - {name: common, tenants: [tenant-a, tenant-b]}\n";
}

class TenantsTest : public TenantPkiTest<TenantsTest> {
 public:
  static constexpr const char* kPkiTag = "tenants_test";

 protected:
  void SetUp() override {
    TenantPkiTest::SetUp();
    if (HasFatalFailure()) return;
    const std::string cfg = pki_->path("tenants.yaml");
    std::ofstream(cfg) << TenantsYaml(*pki_);
    daemon_ = StartDaemon({"--config", cfg});
    ASSERT_NE(daemon_, nullptr);
  }

  client::ConnectOptions Options(const std::string& cert, const std::string& ns = "") const {
    client::ConnectOptions o;
    o.address = daemon_->address();
    o.rpc_timeout_ms = 5000;
    o.tls_ca_file = pki_->path("ca.pem");
    if (!cert.empty()) {
      o.tls_cert_file = pki_->path(cert + ".pem");
      o.tls_key_file = pki_->path(cert + ".key");
    }
    o.shared_namespace = ns;
    return o;
  }
  std::unique_ptr<client::Client> As(const std::string& cert, const std::string& ns = "") {
    auto c = client::Client::Connect(Options(cert, ns));
    EXPECT_TRUE(c.ok()) << cert << ": " << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::unique_ptr<testing::LocalDaemon> daemon_;
};

TEST_F(TenantsTest, TenantBCannotFindLoadDeleteClearOrReleaseTenantAsPagesOverGrpc) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  const client::Codec codec_b = RegisterRefmodel(*b);
  TenantPages p = MakeTenantPages(codec, 100, 3);
  auto stored = a->Store(codec, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 3u);

  // Same codec, same keys: B finds nothing and loads nothing.
  EXPECT_EQ(FoundKeys(*b, codec_b, p.keys), 0u);
  auto loaded = b->Load(codec_b, p.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->matched, 0u);
  // Delete and clear touch only B's own pages.
  auto del = b->Delete(codec_b, p.keys);
  ASSERT_TRUE(del.ok()) << del.status();
  for (const absl::Status& s : *del) EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  auto cleared = b->Clear(nullptr, /*include_pinned=*/true);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_EQ(*cleared, 0u);
  cleared = b->Clear(&codec_b.id, true);
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(*cleared, 0u);
  EXPECT_EQ(FoundKeys(*a, codec, p.keys), 3u);

  // Equal block keys of two tenants never deduplicate: B stores its own copy.
  stored = b->Store(codec_b, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 3u);
  EXPECT_EQ(stored->deduplicated, 0u);

  // A's lease: B can neither release, renew nor read through it.
  auto lease = a->Lookup(codec, p.keys, {.pin = true});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->lease_ids.size(), 1u);
  const uint64_t id = lease->lease_ids[0];
  EXPECT_TRUE(b->Release(id).ok());  // unknown leases are OK (idempotent) ...
  auto renewed = b->RenewLease(id, 1000);
  EXPECT_EQ(renewed.status().code(), StatusCode::kNotFound) << renewed.status();
  // ... and A's lease is still there.
  EXPECT_TRUE(a->RenewLease(id, 5000).ok());
  EXPECT_TRUE(a->Release(*lease).ok());

  auto stats_b = b->GetStats();
  ASSERT_TRUE(stats_b.ok()) << stats_b.status();
  EXPECT_EQ(stats_b->pages, 3u);  // its own copies only
}

// The raw RPCs that take ids rather than keys: B presenting A's reservation id to WritePages,
// Commit and Abort, and A's lease id to ReadPages (the client library never sends another
// tenant's ids; an attacker's own stub does).
TEST_F(TenantsTest, TenantBCannotUseTenantAsReservationOrLeaseIds) {
  auto stub_as = [&](const std::string& cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadTextFile(pki_->path("ca.pem"));
    o.pem_private_key = ReadTextFile(pki_->path(cert + ".key"));
    o.pem_cert_chain = ReadTextFile(pki_->path(cert + ".pem"));
    return pb::KvCache::NewStub(grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(o)));
  };
  auto ctx = [](grpc::ClientContext* c) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  };
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  RegisterRefmodel(*b);
  auto sa = stub_as("tenant-a"), sb = stub_as("tenant-b");
  const std::string codec_id(reinterpret_cast<const char*>(codec.id.bytes.data()), 16);
  TenantPages p = MakeTenantPages(codec, 150, 2);
  const std::string key0(reinterpret_cast<const char*>(p.keys[0].bytes.data()), 16);

  // A reserves key 0 and leaves it uncommitted.
  pb::ReserveRequest reserve;
  reserve.set_codec_id(codec_id);
  reserve.add_items()->set_key(key0);
  reserve.mutable_items(0)->set_kind(pb::PAGE_KIND_INT2);
  pb::ReserveResponse reserved;
  {
    grpc::ClientContext c;
    ctx(&c);
    ASSERT_TRUE(sa->Reserve(&c, reserve, &reserved).ok());
  }
  ASSERT_EQ(reserved.results(0).status().code(), 0) << reserved.results(0).status().message();
  const uint64_t rid = reserved.reservation_id();
  ASSERT_NE(rid, 0u);

  // B writes into A's reservation: NOT_FOUND, nothing written.
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::WriteResponse wr;
    auto w = sb->WritePages(&c, &wr);
    pb::WriteChunk chunk;
    chunk.set_reservation_id(rid);
    chunk.set_key(key0);
    chunk.set_offset(0);
    chunk.set_data(std::string(reinterpret_cast<const char*>(p.bytes[0].data()), 4096));
    w->Write(chunk);
    w->WritesDone();
    grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  // B commits it: NOT_FOUND. B aborts it: OK, a no-op.
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::CommitRequest commit;
    commit.set_reservation_id(rid);
    pb::CommitResponse cr;
    grpc::Status s = sb->Commit(&c, commit, &cr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::AbortRequest abort;
    abort.set_reservation_id(rid);
    pb::AbortResponse ar;
    EXPECT_TRUE(sb->Abort(&c, abort, &ar).ok());
  }
  // A's reservation is intact: the key is still in progress for A (ABORTED), A aborts it.
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::ReserveResponse again;
    ASSERT_TRUE(sa->Reserve(&c, reserve, &again).ok());
    EXPECT_EQ(again.results(0).status().code(), static_cast<int>(grpc::StatusCode::ABORTED))
        << again.results(0).status().message();
  }
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::AbortRequest abort;
    abort.set_reservation_id(rid);
    pb::AbortResponse ar;
    EXPECT_TRUE(sa->Abort(&c, abort, &ar).ok());
  }

  // A stores and pins page 1; B streams ReadPages of A's lease (all pages, and by key).
  ASSERT_TRUE(a->Store(codec, std::span<const client::PageWrite>(&p.writes[1], 1)).ok());
  auto lease = a->Lookup(codec, std::span<const BlockKey>(&p.keys[1], 1), {.pin = true});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->lease_ids.size(), 1u);
  for (bool by_key : {false, true}) {
    grpc::ClientContext c;
    ctx(&c);
    pb::ReadRequest read;
    read.set_lease_id(lease->lease_ids[0]);
    if (by_key) read.add_keys(std::string(reinterpret_cast<const char*>(p.keys[1].bytes.data()), 16));
    auto r = sb->ReadPages(&c, read);
    pb::ReadChunk chunk;
    size_t bytes = 0;
    while (r->Read(&chunk)) bytes += chunk.data().size();
    grpc::Status s = r->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_EQ(bytes, 0u) << "tenant-b read tenant-a's page bytes";
  }
  // A reads its own lease.
  {
    grpc::ClientContext c;
    ctx(&c);
    pb::ReadRequest read;
    read.set_lease_id(lease->lease_ids[0]);
    auto r = sa->ReadPages(&c, read);
    pb::ReadChunk chunk;
    size_t bytes = 0;
    while (r->Read(&chunk)) bytes += chunk.data().size();
    EXPECT_TRUE(r->Finish().ok());
    EXPECT_EQ(bytes, p.bytes[1].size());
  }
  EXPECT_TRUE(a->Release(*lease).ok());
}

TEST_F(TenantsTest, HandlesOpenAndCloseOnlyForTheirTenant) {
  auto ha = client::HandleClient::Connect(Options("tenant-a"));
  auto hb = client::HandleClient::Connect(Options("tenant-b"));
  ASSERT_TRUE(ha.ok() && hb.ok()) << ha.status() << hb.status();
  const client::Codec codec = RegisterRefmodel((*ha)->client());
  RegisterRefmodel((*hb)->client());
  TenantPages p = MakeTenantPages(codec, 200, 2);
  ASSERT_TRUE((*ha)->client().Store(codec, p.writes).ok());
  ASSERT_TRUE((*ha)->PublishKeys(codec, "req-1", p.keys, "meta").ok());

  auto opened = (*hb)->Open("req-1");
  EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status();
  absl::Status closed = (*hb)->Close("req-1");
  EXPECT_TRUE(closed.ok() || closed.code() == StatusCode::kNotFound) << closed;
  // Still A's, still open.
  auto mine = (*ha)->Open("req-1");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->pages.size(), 2u);
  // Names are per tenant: B may use the same name for its own handle.
  TenantPages q = MakeTenantPages(codec, 300, 1);
  ASSERT_TRUE((*hb)->client().Store(codec, q.writes).ok());
  EXPECT_TRUE((*hb)->PublishKeys(codec, "req-1", q.keys, "").ok());
  EXPECT_TRUE((*ha)->Close("req-1").ok());
  EXPECT_TRUE((*hb)->Open("req-1").ok());
}

TEST_F(TenantsTest, CertificatesThatNameNoTenantAreRefused) {
  auto m = client::Client::Connect(Options("mallory"));
  EXPECT_EQ(m.status().code(), StatusCode::kPermissionDenied) << m.status();
  EXPECT_NE(m.status().message().find("names no tenant"), absl::string_view::npos) << m.status();
  // No certificate at all: the TLS handshake itself refuses it (mTLS).
  EXPECT_FALSE(client::Client::Connect(Options("")).ok());
  // A URI SAN names a tenant too.
  auto c = As("uri");
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  TenantPages p = MakeTenantPages(codec, 400, 1);
  auto stored = c->Store(codec, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 1u);
}

TEST_F(TenantsTest, AdminClearsEveryTenantAndSeesEveryonesStats) {
  auto a = As("tenant-a"), b = As("tenant-b"), admin = As("admin");
  ASSERT_TRUE(a && b && admin);
  const client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  ASSERT_TRUE(a->Store(ca, MakeTenantPages(ca, 500, 2).writes).ok());
  TenantPages pb_pages = MakeTenantPages(cb, 600, 3);
  ASSERT_TRUE(b->Store(cb, pb_pages.writes).ok());
  auto pinned = b->Lookup(cb, pb_pages.keys, {.pin = true});
  ASSERT_TRUE(pinned.ok());

  auto sa = a->GetStats(), sadmin = admin->GetStats();
  ASSERT_TRUE(sa.ok() && sadmin.ok());
  EXPECT_EQ(sa->pages, 2u);
  EXPECT_EQ(sadmin->pages, 5u);
  // A tenant's "clear --all" is its own pages only; the admin's is everyone's.
  auto cleared = a->Clear(nullptr, true);
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(*cleared, 2u);
  cleared = admin->Clear(nullptr, /*include_pinned=*/true);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_EQ(*cleared, 3u);
  EXPECT_EQ(FoundKeys(*b, cb, pb_pages.keys), 0u);
  EXPECT_TRUE(b->Release(*pinned).ok());
}

// The UCX data plane's remote key covers the whole pool: with tenants nobody gets it (no
// process maps the pool for UCX unless ucx.allow_unverified_rma; ucx_tenant_test), a tenant
// gets a data plane of its own.
TEST_F(TenantsTest, NoTenantGetsTheWholePoolUcxKey) {
  auto get = [&](const std::string& cert, pb::GetDataPlaneResponse* resp) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadTextFile(pki_->path("ca.pem"));
    o.pem_private_key = ReadTextFile(pki_->path(cert + ".key"));
    o.pem_cert_chain = ReadTextFile(pki_->path(cert + ".pem"));
    auto stub = pb::KvCache::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(o)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->GetDataPlane(&ctx, pb::GetDataPlaneRequest(), resp);
  };
  pb::GetDataPlaneResponse admin, tenant, none;
  grpc::Status s = get("mallory", &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("names no tenant"), std::string::npos) << s.error_message();
  // Not the pool key, not even for the admin: there is no whole-pool data plane. Admins, like
  // tenants, get data planes of their own over staging regions (ucx_tenant_test loads through
  // them); where this machine's UCX did not start, there is no data plane at all.
  s = get("admin", &admin);
  if (!s.ok()) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    GTEST_SKIP() << "UCX did not start on this machine: " << s.error_message();
  }
  EXPECT_TRUE(admin.staged());
  s = get("tenant-a", &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(tenant.staged());
  EXPECT_NE(tenant.pool_rkey(), admin.pool_rkey());
  EXPECT_FALSE(tenant.pool_rkey().empty());
}

// The one way to share: a configured shared namespace, chosen by the client option.
TEST_F(TenantsTest, SharedNamespaceIsSharedByItsMembersOnly) {
  auto a = As("tenant-a", "common"), b = As("tenant-b", "common");
  ASSERT_TRUE(a && b);
  const client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  TenantPages p = MakeTenantPages(ca, 700, 2);
  ASSERT_TRUE(a->Store(ca, p.writes).ok());
  EXPECT_EQ(FoundKeys(*b, cb, p.keys), 2u);
  auto loaded = b->Load(cb, p.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->matched, 2u);
  EXPECT_EQ(loaded->pages[1], p.bytes[1]);
  // Outside the namespace, B's own keys do not see them.
  auto own = As("tenant-b");
  const client::Codec co = RegisterRefmodel(*own);
  EXPECT_EQ(FoundKeys(*own, co, p.keys), 0u);
  // A non-member cannot select it.
  auto c = client::Client::Connect(Options("uri", "common"));
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
}

// The same through the C ABI (liboscarkv_c.so's oscarkv_tls_options.shared_namespace):
// client_c_abi_test ADDR --tenants DIR stores as tenant-a, finds and loads as tenant-b, and is
// refused as the non-member tenant-c.
TEST_F(TenantsTest, CAbiSharedNamespaceIsSharedByItsMembersOnly) {
  const std::string dir = pki_->path("");
  std::string out;
  EXPECT_EQ(RunTool(OSCARKV_C_ABI_TEST_PATH, daemon_->address() + " --tenants " + dir, &out), 0) << out;
}

#ifdef OSCARKV_CLI_PATH
// `oscarkv <args>`: the exit code; stdout and stderr together in *out.
int RunCli(const std::string& args, std::string* out) {
  return RunTool(OSCARKV_CLI_PATH, args, out);
}

// The operator commands' --shared-namespace: tenant-b looks up what tenant-a stored there.
TEST_F(TenantsTest, CliSharedNamespaceFlag) {
  auto a = As("tenant-a", "common");
  ASSERT_TRUE(a);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 800, 2);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const std::string keys = " --shape refmodel --keys " + p.keys[0].Hex() + "," + p.keys[1].Hex();
  auto as = [&](const std::string& who) {
    return " --addr " + daemon_->address() + " --tls-ca " + pki_->path("ca.pem") +
           " --tls-cert " + pki_->path(who + ".pem") + " --tls-key " + pki_->path(who + ".key");
  };
  std::string out;
  EXPECT_EQ(RunCli("lookup" + as("tenant-b") + " --shared-namespace common" + keys, &out), 0)
      << out;
  EXPECT_NE(out.find("2 of 2 blocks cached"), std::string::npos) << out;
  EXPECT_EQ(RunCli("lookup" + as("tenant-b") + keys, &out), 0) << out;
  EXPECT_NE(out.find("0 of 2 blocks cached"), std::string::npos) << out;
  EXPECT_EQ(RunCli("stats" + as("uri") + " --shared-namespace common", &out), 1) << out;
  EXPECT_NE(out.find("PERMISSION_DENIED"), std::string::npos) << out;
  EXPECT_EQ(RunCli("lookup --help", &out), 0) << out;
  EXPECT_NE(out.find("--shared-namespace"), std::string::npos) << out;
}

// `oscarkv codec unregister` and `oscarkv clear --codecs`: another tenant's registration is
// NOT_FOUND, one with pages is refused (FAILED_PRECONDITION), and clear --codecs frees it.
TEST_F(TenantsTest, CliUnregistersCodecs) {
  auto a = As("tenant-a");
  ASSERT_TRUE(a);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 820, 1);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto as = [&](const std::string& who) {
    return " --addr " + daemon_->address() + " --tls-ca " + pki_->path("ca.pem") +
           " --tls-cert " + pki_->path(who + ".pem") + " --tls-key " + pki_->path(who + ".key");
  };
  std::string out;
  EXPECT_EQ(RunCli("codec unregister --shape refmodel" + as("tenant-b"), &out), 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  EXPECT_EQ(RunCli("codec unregister --shape refmodel" + as("tenant-a"), &out), 1) << out;
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;
  EXPECT_EQ(RunCli("clear --shape refmodel --codecs" + as("tenant-a"), &out), 0) << out;
  EXPECT_NE(out.find("1 pages removed"), std::string::npos) << out;
  EXPECT_NE(out.find("1 codecs unregistered"), std::string::npos) << out;
  EXPECT_EQ(a->Lookup(codec, p.keys).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(RunCli("codec unregister --codec " + codec.id.Hex() + as("tenant-a"), &out), 1)
      << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  // Registered again, then removed with its page in one call.
  ASSERT_TRUE(a->RegisterCodec(codec.profile).ok());
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  EXPECT_EQ(RunCli("codec unregister --drop-pages --json --shape refmodel" + as("tenant-a"), &out),
            0) << out;
  EXPECT_NE(out.find("\"pages_removed\": 1"), std::string::npos) << out;
  EXPECT_EQ(RunCli("codec unregister --shape refmodel --codec 00" + as("tenant-a"), &out), 2)
      << out;
}
#endif

// ---- the local socket, as children that setuid to a mapped (or unmapped) uid ----

std::string Frame(v1::local::Method m, uint64_t id, const google::protobuf::MessageLite& msg) {
  v1::local::RequestHeader h;
  h.method = static_cast<uint16_t>(m);
  h.id = id;
  std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
  f += msg.SerializeAsString();
  return f;
}

struct LocalAnswer {
  uint32_t code = 99;
  std::string message, body;
};

// Connects to `path` as `uid`, sends each frame and reads one answer per frame (stops at the
// first refusal); with no frames, reads the one frame the daemon sends first, if any. The frames
// are built before the fork: the child only makes system calls.
std::vector<LocalAnswer> LocalExchange(const std::string& path, uint32_t uid,
                                       const std::vector<std::string>& frames) {
  int pipefd[2];
  EXPECT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) ::_exit(4);
    static char buf[v1::local::kMaxFrameBytes];
    if (frames.empty()) {  // only read what the daemon says first (a refused peer's frame)
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        const uint32_t len = static_cast<uint32_t>(n);
        (void)!::write(pipefd[1], &len, 4);
        (void)!::write(pipefd[1], buf, len);
      }
    }
    for (const std::string& f : frames) {
      // A refused peer's send may fail (the daemon already closed); its refusal frame is still
      // there to read.
      const bool sent = ::send(fd, f.data(), f.size(), MSG_NOSIGNAL) >= 0;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (!sent && n <= 0) break;
      if (n <= 0) break;
      const uint32_t len = static_cast<uint32_t>(n);
      (void)!::write(pipefd[1], &len, 4);
      (void)!::write(pipefd[1], buf, len);
      v1::local::ResponseHeader h;
      std::memcpy(&h, buf, sizeof(h));
      if (h.code != 0) break;
    }
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof(buf))) > 0;) all.append(buf, n);
  ::close(pipefd[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  std::vector<LocalAnswer> out;
  for (size_t at = 0; at + 4 <= all.size();) {
    uint32_t len;
    std::memcpy(&len, all.data() + at, 4);
    at += 4;
    v1::local::ResponseHeader h;
    if (len < sizeof(h) || at + len > all.size()) break;
    std::memcpy(&h, all.data() + at, sizeof(h));
    LocalAnswer ans;
    ans.code = h.code;
    ans.message.assign(all.data() + at + sizeof(h), std::min<uint32_t>(h.message_bytes,
                                                                       len - sizeof(h)));
    ans.body.assign(all.data() + at + sizeof(h) + ans.message.size(),
                    len - sizeof(h) - ans.message.size());
    out.push_back(std::move(ans));
    at += len;
  }
  return out;
}

TEST_F(TenantsTest, LocalSocketPeersAreTheTenantsTheirUidsMapTo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as other uids";
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  RegisterRefmodel(*b);
  TenantPages p = MakeTenantPages(codec, 800, 2);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const std::string path = daemon_->local_socket();
  ASSERT_FALSE(path.empty());

  pb::HandshakeRequest hs;
  hs.set_wire_version(pb::WIRE_VERSION_1);
  pb::LookupRequest lookup;
  lookup.set_codec_id(std::string(reinterpret_cast<const char*>(codec.id.bytes.data()), 16));
  for (const BlockKey& k : p.keys) {
    lookup.add_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), 16));
  }
  lookup.set_pin(true);
  const std::string hs_frame = Frame(v1::local::Method::kHandshake, 1, hs);
  const std::string lookup_frame = Frame(v1::local::Method::kLookup, 2, lookup);

  // uid kUidA is tenant-a: it finds and pins its pages.
  auto ans = LocalExchange(path, kUidA, {hs_frame, lookup_frame});
  ASSERT_EQ(ans.size(), 2u);
  ASSERT_EQ(ans[1].code, 0u) << ans[1].message;
  pb::LookupResponse found;
  ASSERT_TRUE(found.ParseFromString(ans[1].body));
  EXPECT_EQ(found.matched(), 2);
  ASSERT_NE(found.lease_id(), 0u);

  // uid kUidB is tenant-b: the same lookup finds nothing; releasing A's lease does nothing.
  pb::ReleaseRequest release;
  release.set_lease_id(found.lease_id());
  ans = LocalExchange(path, kUidB,
                      {hs_frame, lookup_frame, Frame(v1::local::Method::kRelease, 3, release)});
  ASSERT_EQ(ans.size(), 3u);
  ASSERT_EQ(ans[1].code, 0u) << ans[1].message;
  pb::LookupResponse not_found;
  ASSERT_TRUE(not_found.ParseFromString(ans[1].body));
  EXPECT_EQ(not_found.matched(), 0);
  EXPECT_EQ(not_found.pages_size(), 0);
  EXPECT_TRUE(a->RenewLease(found.lease_id(), 5000).ok()) << "B's Release ended A's lease";
  EXPECT_TRUE(a->Release(found.lease_id()).ok());

  // AttachStaging without a staging descriptor is refused (a tenant's whole shared-memory
  // exchange, which never passes it the pool, is tenant_shm_test's).
  pb::AttachStagingRequest attach;
  attach.set_staging_bytes(1 << 20);
  ans = LocalExchange(path, kUidA,
                      {hs_frame, Frame(v1::local::Method::kAttachStaging, 4, attach)});
  ASSERT_EQ(ans.size(), 2u);
  EXPECT_EQ(ans[1].code, static_cast<uint32_t>(StatusCode::kInvalidArgument)) << ans[1].message;

  // An unmapped uid reads one PERMISSION_DENIED frame (sent at accept, before any request: a
  // request sent into the closing connection could reset it before the frame is read).
  ans = LocalExchange(path, kUidStranger, {});
  ASSERT_EQ(ans.size(), 1u);
  EXPECT_EQ(ans[0].code, static_cast<uint32_t>(StatusCode::kPermissionDenied));
  EXPECT_NE(ans[0].message.find("is no tenant"), std::string::npos) << ans[0].message;
}

// ---- quotas: tenant-a exhausts each; tenant-b keeps working ----

TEST_F(TenantsTest, CodecQuota) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  CodecProfile prof = *BuiltinProfile("refmodel");
  for (const char* rev : {"r1", "r2"}) {
    prof.model_revision = rev;
    ASSERT_TRUE(a->RegisterCodec(prof).ok());
  }
  ASSERT_TRUE(a->RegisterCodec(prof).ok());  // idempotent: no new slot
  prof.model_revision = "r3";
  auto over = a->RegisterCodec(prof);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("codecs quota"), absl::string_view::npos);
  EXPECT_TRUE(b->RegisterCodec(prof).ok());
}

TEST_F(TenantsTest, LeaseAndPinnedPageQuotas) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  TenantPages p = MakeTenantPages(ca, 900, 8);
  ASSERT_TRUE(a->Store(ca, p.writes).ok());
  TenantPages q = MakeTenantPages(cb, 950, 2);
  ASSERT_TRUE(b->Store(cb, q.writes).ok());
  // pinned_pages 16: two leases of 8 pages fill it; a third page is over.
  std::vector<client::LookupResult> held;
  for (int i = 0; i < 2; ++i) {
    auto l = a->Lookup(ca, p.keys, {.pin = true});
    ASSERT_TRUE(l.ok()) << l.status();
    held.push_back(*l);
  }
  auto over = a->Lookup(ca, std::span<const BlockKey>(p.keys.data(), 1), {.pin = true});
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("pinned_pages quota"), absl::string_view::npos);
  EXPECT_TRUE(b->Lookup(cb, q.keys, {.pin = true}).ok());
  // A probe (no pin) still works for A.
  EXPECT_EQ(FoundKeys(*a, ca, p.keys), 8u);
  for (auto& l : held) ASSERT_TRUE(a->Release(l).ok());
  held.clear();
  // leases 4: four one-page leases, the fifth is over.
  for (int i = 0; i < 4; ++i) {
    auto l = a->Lookup(ca, std::span<const BlockKey>(&p.keys[i], 1), {.pin = true});
    ASSERT_TRUE(l.ok()) << l.status();
    held.push_back(*l);
  }
  over = a->Lookup(ca, std::span<const BlockKey>(&p.keys[5], 1), {.pin = true});
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("leases quota"), absl::string_view::npos);
  EXPECT_TRUE(b->Lookup(cb, q.keys, {.pin = true}).ok());
  ASSERT_TRUE(a->Release(held.back()).ok());
  EXPECT_TRUE(a->Lookup(ca, std::span<const BlockKey>(&p.keys[5], 1), {.pin = true}).ok());
}

TEST_F(TenantsTest, HandleQuota) {
  auto ha = client::HandleClient::Connect(Options("tenant-a"));
  auto hb = client::HandleClient::Connect(Options("tenant-b"));
  ASSERT_TRUE(ha.ok() && hb.ok());
  const client::Codec ca = RegisterRefmodel((*ha)->client());
  const client::Codec cb = RegisterRefmodel((*hb)->client());
  TenantPages p = MakeTenantPages(ca, 1000, 1);
  ASSERT_TRUE((*ha)->client().Store(ca, p.writes).ok());
  ASSERT_TRUE((*hb)->client().Store(cb, p.writes).ok());
  ASSERT_TRUE((*ha)->PublishKeys(ca, "h1", p.keys, "").ok());
  ASSERT_TRUE((*ha)->PublishKeys(ca, "h2", p.keys, "").ok());
  auto over = (*ha)->PublishKeys(ca, "h3", p.keys, "");
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("handles quota"), absl::string_view::npos);
  EXPECT_TRUE((*hb)->PublishKeys(cb, "h3", p.keys, "").ok());
  ASSERT_TRUE((*ha)->Close("h1").ok());
  EXPECT_TRUE((*ha)->PublishKeys(ca, "h3", p.keys, "").ok());
}

// pool_mb 1: tenant-a's stores beyond its MiB evict its own older pages, never tenant-b's; with
// all of its pages pinned, a store is RESOURCE_EXHAUSTED. Meanwhile tenant-b's lookups are timed.
TEST_F(TenantsTest, PoolQuotaAndAFloodingTenantLeaveTheOtherWorking) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  const size_t fit = (size_t{1} << 20) / ca.int2_page_bytes;
  ASSERT_GE(fit, 2u);
  TenantPages mine = MakeTenantPages(cb, 5000, 16);
  ASSERT_TRUE(b->Store(cb, mine.writes).ok());

  // tenant-a floods: stores 3x its quota, pins to its limits, registers codecs, while tenant-b
  // looks up its 16 pages.
  TenantPages flood = MakeTenantPages(ca, 6000, 3 * fit);
  std::atomic<bool> done{false};
  std::atomic<int> flood_errors{0};
  std::thread flooder([&] {
    CodecProfile prof = *BuiltinProfile("refmodel");
    for (int round = 0; round < 50 && !done.load(); ++round) {
      for (size_t i = 0; i < flood.writes.size(); ++i) {
        auto r = a->Store(ca, std::span<const client::PageWrite>(&flood.writes[i], 1));
        if (!r.ok()) ++flood_errors;
      }
      (void)a->Lookup(ca, flood.keys, {.pin = true, .lease_ms = 200});
      prof.model_revision = "flood-" + std::to_string(round);
      (void)a->RegisterCodec(prof);
    }
  });
  std::vector<double> ms;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = b->Lookup(cb, mine.keys);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->matched, 16u) << "tenant-b lost pages to tenant-a's flood";
  }
  done = true;
  flooder.join();
  std::sort(ms.begin(), ms.end());
  std::printf("tenant-b lookup (16 keys) while tenant-a floods: p50 %.3f ms, p99 %.3f ms (%zu)\n",
              ms[ms.size() / 2], ms[ms.size() * 99 / 100], ms.size());
  EXPECT_EQ(flood_errors.load(), 0) << "stores over the pool quota evict the tenant's own pages";

  // Within its quota, and only its own pages went.
  auto sa = a->GetStats();
  ASSERT_TRUE(sa.ok());
  EXPECT_LE(sa->pool_used_bytes, uint64_t{1} << 20);
  EXPECT_GE(sa->pages, 1u);
  EXPECT_EQ(FoundKeys(*b, cb, mine.keys), 16u);

  // Everything of tenant-a pinned: nothing of its own to evict, so over its quota.
  TenantPages last = MakeTenantPages(ca, 7000, fit);
  ASSERT_TRUE(a->Clear(nullptr, true).ok());
  auto st = a->Store(ca, last.writes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->stored, fit);
  auto pinned = a->Lookup(ca, last.keys, {.pin = true});
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  TenantPages extra = MakeTenantPages(ca, 8000, 1);
  st = a->Store(ca, extra.writes);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->item_status.size(), 1u);
  EXPECT_EQ(st->item_status[0].code(), StatusCode::kResourceExhausted) << st->item_status[0];
  EXPECT_NE(st->item_status[0].message().find("pool_mb quota"), absl::string_view::npos)
      << st->item_status[0];
  EXPECT_TRUE(b->Store(cb, MakeTenantPages(cb, 9000, 2).writes).ok());
  EXPECT_TRUE(a->Release(*pinned).ok());
}

}  // namespace
}  // namespace oscarkv::testing
