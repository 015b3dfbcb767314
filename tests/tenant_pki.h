// Shared by the tenant tests (tenants_test, tenants_tier_test): a throwaway PKI made by the
// openssl tool at test time, and real pages to store per tenant.
//   test-ca -> server (CN=127.0.0.1, SAN IP:127.0.0.1), client certificates whose subject CNs
//              are tenant-a, tenant-b, admin and mallory (the right CA, a CN no tenant has), and
//              "uri" (CN some-workload, URI SAN spiffe://oscarkv.test/tenant-c)
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/client/client.h"
#include "test_util.h"

namespace oscarkv::testing {

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class TenantPki {
 public:
  explicit TenantPki(const std::string& tag)
      : dir_(::testing::TempDir() + "/" + tag + "_" + std::to_string(::getpid())) {
    const std::string d = dir_;
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::filesystem::create_directories(d);
    std::ofstream(d + "/san.cnf") << "subjectAltName = IP:127.0.0.1, DNS:localhost\n";
    std::ofstream(d + "/uri.cnf") << "subjectAltName = URI:spiffe://oscarkv.test/tenant-c\n";
    const std::string script =
        "set -e; cd " + d + ";"
        " openssl req -x509" + ec + "-days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem;"
        " openssl req" + ec + "-subj /CN=127.0.0.1 -keyout server.key -out server.csr;"
        " openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2"
        " -extfile san.cnf -out server.pem;"
        " n=10; for c in tenant-a tenant-b admin mallory; do n=$((n+1));"
        "  openssl req" + ec + "-subj /CN=$c -keyout $c.key -out $c.csr;"
        "  openssl x509 -req -in $c.csr -CA ca.pem -CAkey ca.key -set_serial $n -days 2"
        "   -out $c.pem; done;"
        " openssl req" + ec + "-subj /CN=some-workload -keyout uri.key -out uri.csr;"
        " openssl x509 -req -in uri.csr -CA ca.pem -CAkey ca.key -set_serial 20 -days 2"
        "  -extfile uri.cnf -out uri.pem";
    ok_ = std::system(("bash -c '" + script + "' > " + d + "/openssl.log 2>&1").c_str()) == 0;
  }
  ~TenantPki() { std::filesystem::remove_all(dir_); }
  TenantPki(const TenantPki&) = delete;
  TenantPki& operator=(const TenantPki&) = delete;
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string log() const { return ReadTextFile(path("openssl.log")); }

 private:
  std::string dir_;
  bool ok_ = false;
};

// A fixture whose test suite shares one TenantPki (a few openssl runs), made in
// SetUpTestSuite under TempDir()/<Derived::kPkiTag>_<pid> and removed in TearDownTestSuite;
// SetUp asserts the certificates were made. Use: class F : public TenantPkiTest<F> with a public
// `static constexpr const char* kPkiTag`; an overriding SetUp calls TenantPkiTest::SetUp() first.
template <typename Derived>
class TenantPkiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new TenantPki(Derived::kPkiTag); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(pki_->ok()) << pki_->log(); }

  static inline TenantPki* pki_ = nullptr;
};

// `n` real pages of `codec` (seeds seed..seed+n-1), each its own one-block request.
struct TenantPages {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<client::PageWrite> writes;
};
inline TenantPages MakeTenantPages(const client::Codec& codec, uint64_t seed, size_t n) {
  TenantPages p;
  for (size_t i = 0; i < n; ++i) {
    const auto tokens = Tokens(seed + i, codec.profile.page_tokens);
    p.keys.push_back(client::Client::BlockKeys(codec, tokens)[0]);
    p.bytes.push_back(MakePage(codec.profile, PageKind::kInt2, seed + i));
  }
  for (size_t i = 0; i < n; ++i) p.writes.push_back({p.keys[i], PageKind::kInt2, p.bytes[i]});
  return p;
}

// Keys a probe (Lookup without pin) finds, one key per call: pool and tier pages count.
inline uint32_t FoundKeys(client::Client& c, const client::Codec& codec,
                          std::span<const BlockKey> keys) {
  uint32_t hits = 0;
  for (const BlockKey& k : keys) {
    auto r = c.Lookup(codec, std::span<const BlockKey>(&k, 1));
    EXPECT_TRUE(r.ok()) << r.status();
    hits += r.ok() ? r->matched : 0;
  }
  return hits;
}

}  // namespace oscarkv::testing
