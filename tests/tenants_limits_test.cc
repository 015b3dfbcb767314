// Daemon-wide limits of a tenants: config, against a real daemon with certificates made by
// openssl at test time: pool_mb quotas that do not fit the pool are refused at start.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tenant_pki.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

class TenantsLimitsTest : public TenantPkiTest<TenantsLimitsTest> {
 public:
  static constexpr const char* kPkiTag = "tenants_limits_test";

 protected:
  std::string Config(const std::string& tenants) const {
    const std::string cfg = pki_->path("tenants_" + std::to_string(++configs_) + ".yaml");
    std::ofstream(cfg) << "tls:\n  cert: " << pki_->path("server.pem") << "\n  key: "
                       << pki_->path("server.key") << "\n  client_ca: " << pki_->path("ca.pem")
                       << "\ntenants:\n"
                       << tenants;
    return cfg;
  }
  // Starts a daemon that must fail; its log.
  static std::string FailedStart(const std::vector<std::string>& flags) {
    testing::LocalDaemonOptions o;
    o.binary = OSCARKVD_PATH;
    o.flags = {"--metrics-listen", "off", "--shm-name", UniqueShmName("oscarkv-tl", 0)};
    o.flags.insert(o.flags.end(), flags.begin(), flags.end());
    o.log_path = ::testing::TempDir() + "/tenants_limits_" + std::to_string(::getpid()) + ".log";
    auto d = testing::LocalDaemon::Start(o);
    EXPECT_FALSE(d.ok()) << "started";
    const std::string log = ReadTextFile(o.log_path);
    std::remove(o.log_path.c_str());
    return log;
  }
  mutable int configs_ = 0;
};

// Before: tenants' pool_mb could add up to more than the pool, so a tenant within its quota
// could find no room while others stayed within theirs. Now the daemon does not start.
TEST_F(TenantsLimitsTest, PoolQuotasAddingUpToMoreThanThePoolAreRefusedAtStart) {
  const std::string over = Config(
      "  - {name: tenant-a, quota: {pool_mb: 48}}\n  - {name: tenant-b, quota: {pool_mb: 48}}\n");
  const std::string log = FailedStart({"--config", over, "--pool-mb", "64"});
  EXPECT_NE(log.find("oscarkvd: tenants: the pool_mb quotas add up to 96 MiB, but the pool "
                     "holds 64 MiB"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("Lower the quotas or enlarge the pool"), std::string::npos) << log;
  // The same quotas in a pool that holds them: the daemon starts.
  auto d = StartDaemon({"--config", over, "--pool-mb", "96"});
  EXPECT_NE(d, nullptr);
}

}  // namespace
}  // namespace oscarkv::testing
