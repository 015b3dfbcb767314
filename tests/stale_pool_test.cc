// A daemon killed with SIGKILL leaves its pool file and local socket in /dev/shm. A daemon
// started on the same fixed shm_name takes them over (the dead owner's lock is gone); a second
// daemon next to a live one is refused with the live one's pid.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace oscarkv::testing {
namespace {

// Waits (bounded) until `pid` has died: a zombie or gone. The test does not reap it (reaping
// through LocalDaemon would remove the file this test wants left behind).
bool WaitDead(pid_t pid) {
  for (int i = 0; i < 400; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(StalePoolTest, FixedNameRestartAfterKill9TakesTheFileOver) {
  const std::string name = UniqueShmName("oscarkv-stale", 0);
  const std::string path = "/dev/shm/" + name;
  const std::vector<std::string> flags = {"--shm-name", name, "--pool-mb", "16"};
  auto first = StartDaemon(flags);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->shm_path(), path);
  ::kill(first->pid(), SIGKILL);
  ASSERT_TRUE(WaitDead(first->pid()));
  ASSERT_TRUE(std::filesystem::exists(path));  // what kill -9 leaves behind
  ASSERT_TRUE(std::filesystem::exists(path + ".sock"));

  for (int round = 0; round < 2; ++round) {
    testing::LocalDaemonOptions o;
    o.binary = OSCARKVD_PATH;
    o.flags = {"--metrics-listen", "off", "--shm-name", name, "--pool-mb", "16"};
    o.log_path = ::testing::TempDir() + "/stale_pool_" + std::to_string(round) + ".log";
    auto second = testing::LocalDaemon::Start(o);
    ASSERT_TRUE(second.ok()) << second.status() << "\n" << ReadFile(o.log_path);
    EXPECT_NE(ReadFile(o.log_path).find("stale_pool_taken_over"), std::string::npos);
    // It serves: a store and a load through the taken-over file and socket.
    auto c = Connect((*second)->address());
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->server().local_socket, path + ".sock");
    const client::Codec codec = RegisterRefmodel(*c);
    const auto keys = client::Client::BlockKeys(codec, Tokens(round, codec.profile.page_tokens));
    const std::vector<uint8_t> page = MakePage(codec.profile, PageKind::kInt2, round);
    const client::PageWrite w{keys[0], PageKind::kInt2, page};
    auto st = c->Store(codec, std::span<const client::PageWrite>(&w, 1));
    ASSERT_TRUE(st.ok() && st->stored == 1) << (st.ok() ? st->item_status[0] : st.status());
    auto got = c->Load(codec, keys);
    ASSERT_TRUE(got.ok() && got->matched == 1);
    EXPECT_EQ(got->pages[0], page);

    // A live daemon keeps its name: a third one is refused and told who holds it.
    o.log_path = ::testing::TempDir() + "/stale_pool_live_" + std::to_string(round) + ".log";
    o.ready_timeout_ms = 10000;
    auto third = testing::LocalDaemon::Start(o);
    EXPECT_FALSE(third.ok());
    EXPECT_NE(ReadFile(o.log_path).find("in use by pid " + std::to_string((*second)->pid())),
              std::string::npos)
        << ReadFile(o.log_path);
    EXPECT_TRUE((*second)->Running());
    c.reset();
    // Round 0 ends with another kill -9 (round 1 takes over again); round 1 with SIGTERM.
    if (round == 0) {
      ::kill((*second)->pid(), SIGKILL);
      ASSERT_TRUE(WaitDead((*second)->pid()));
      second->release();  // left unreaped on purpose: reaping would remove the file
    } else {
      EXPECT_EQ(*(*second)->Stop(), 0);
      EXPECT_FALSE(std::filesystem::exists(path));
    }
  }
}

}  // namespace
}  // namespace oscarkv::testing
