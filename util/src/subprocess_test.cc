// Subprocess against real programs (/bin/sh, /bin/cat, /bin/sleep): pipes, environment,
// inherited descriptors, exec errors, timeouts, signals, and that no child outlives its owner.
#include "oscarkv/util/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

SpawnOptions Sh(const std::string& script) { return SpawnOptions({"/bin/sh", "-c", script}); }

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(SubprocessTest, CollectsStdoutAndExitCode) {
  auto r = RunAndCollect(Sh("echo hello; echo oops >&2; exit 3"), absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->output, "hello\n");  // stderr is not captured unless asked
  SpawnOptions o = Sh("echo out; echo err >&2");
  o.stderr_to_stdout = true;
  r = RunAndCollect(o, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output, "out\nerr\n");
}

TEST(SubprocessTest, EnvironmentIsSetOnTopOfTheParents) {
  ::setenv("OSCARKV_SUBPROCESS_TEST_KEEP", "kept", 1);
  ::setenv("OSCARKV_SUBPROCESS_TEST_OVERRIDE", "old", 1);
  SpawnOptions o = Sh(
      "echo $OSCARKV_SUBPROCESS_TEST_KEEP $OSCARKV_SUBPROCESS_TEST_OVERRIDE "
      "$OSCARKV_SUBPROCESS_TEST_NEW");
  o.env = {{"OSCARKV_SUBPROCESS_TEST_OVERRIDE", "new"}, {"OSCARKV_SUBPROCESS_TEST_NEW", "x"}};
  auto r = RunAndCollect(o, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output, "kept new x\n");
}

TEST(SubprocessTest, ExecFailureIsAnErrorNotAChildThatExits127) {
  auto p = Subprocess::Spawn(SpawnOptions({"/nonexistent/oscarkv-no-such-program"}));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_NE(p.status().message().find("oscarkv-no-such-program"), std::string_view::npos);
  // With a $PATH search the program is found by name.
  SpawnOptions o({"sh", "-c", "exit 0"});
  o.search_path = true;
  auto r = RunAndCollect(o, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  o.search_path = false;  // without it, "sh" is a relative path that does not exist here
  EXPECT_FALSE(Subprocess::Spawn(o).ok());
  EXPECT_EQ(Subprocess::Spawn(SpawnOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, ProgramDiffersFromArgvZero) {
  SpawnOptions o({"custom-name", "-c", "echo $0"});
  o.program = "/bin/sh";
  auto r = RunAndCollect(o, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output, "custom-name\n");
}

TEST(SubprocessTest, StdinPipeAndEof) {
  SpawnOptions o({"/bin/cat"});
  o.stdin_mode = Stdio::kPipe;
  o.stdout_mode = Stdio::kPipe;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(::write((*p)->stdin_fd(), "abc", 3), 3);
  (*p)->CloseStdin();  // cat sees EOF and exits
  char buf[8] = {};
  ASSERT_EQ(::read((*p)->stdout_fd(), buf, sizeof(buf)), 3);
  EXPECT_EQ(std::string(buf), "abc");
  auto code = (*p)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ((*p)->DescribeExit(), "exit 0");
}

TEST(SubprocessTest, InheritedDescriptorSurvivesExecOthersDoNot) {
  int keep[2], drop[2];
  ASSERT_EQ(::pipe2(keep, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe(drop), 0);  // not close-on-exec: only close_other_fds closes it
  SpawnOptions o = Sh("echo kept >&" + std::to_string(keep[1]) + "; echo leaked >&" +
                      std::to_string(drop[1]) + " 2>/dev/null; exit 0");
  o.inherit_fds = {keep[1]};
  o.close_other_fds = true;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  ::close(keep[1]);
  ::close(drop[1]);
  ASSERT_TRUE((*p)->Wait(absl::Seconds(10)).ok());
  char buf[16] = {};
  EXPECT_EQ(::read(keep[0], buf, sizeof(buf)), 5);
  EXPECT_EQ(std::string(buf), "kept\n");
  EXPECT_EQ(::read(drop[0], buf, sizeof(buf)), 0);  // EOF: the child never had it
  ::close(keep[0]);
  ::close(drop[0]);
}

TEST(SubprocessTest, TimeoutKillsTheChild) {
  const auto t0 = absl::Now();
  auto r = RunAndCollect(SpawnOptions({"/bin/sleep", "30"}), absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  // Wait with a timeout leaves the child running; Terminate ends it.
  auto p = Subprocess::Spawn(SpawnOptions({"/bin/sleep", "30"}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*p)->Running());
  EXPECT_EQ((*p)->Terminate(absl::Seconds(5)), 128 + SIGTERM);
  EXPECT_EQ((*p)->DescribeExit(), "killed by signal 15");
  EXPECT_FALSE((*p)->Running());
}

TEST(SubprocessTest, DestructorKillsAndReaps) {
  pid_t pid;
  {
    auto p = Subprocess::Spawn(SpawnOptions({"/bin/sleep", "30"}));
    ASSERT_TRUE(p.ok()) << p.status();
    pid = (*p)->pid();
    EXPECT_TRUE(Alive(pid));
  }
  EXPECT_FALSE(Alive(pid));  // killed and reaped: not even a zombie
}

TEST(SubprocessTest, SignalFromAnotherThreadWhileWaitBlocks) {
  auto p = Subprocess::Spawn(SpawnOptions({"/bin/sleep", "30"}));
  ASSERT_TRUE(p.ok()) << p.status();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*p)->Signal(SIGKILL);
  });
  auto code = (*p)->Wait();
  killer.join();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGKILL);
  (*p)->Signal(SIGKILL);  // after the reap: a no-op, never another process
  EXPECT_EQ((*p)->Kill(), 128 + SIGKILL);
}

TEST(SubprocessTest, StderrToFileAndStdoutToNull) {
  char path[] = "/tmp/oscarkv-subprocess-test-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  SpawnOptions o = Sh("echo to-null; echo to-file >&2");
  o.stdout_mode = Stdio::kNull;
  o.stderr_path = path;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->Wait(absl::Seconds(10)).ok());
  std::FILE* f = std::fopen(path, "r");
  ASSERT_NE(f, nullptr);
  char buf[32] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  ::unlink(path);
  EXPECT_EQ(std::string(buf, n), "to-file\n");
}

}  // namespace
}  // namespace oscarkv
