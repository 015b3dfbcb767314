#include "oscarkv/testing/stage_hooks.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace oscarkv::testing {
namespace {

TEST(KillAtStageTest, KillsAtItsStageOnly) {
  auto hook = KillAtStage("ipc-copy", "gpu-handoff decode");
  ASSERT_TRUE(hook);
  hook("hello");  // other stages pass
  hook("nccl-recv");
  EXPECT_EXIT(hook("ipc-copy"), ::testing::KilledBySignal(SIGKILL),
              "gpu-handoff decode: dying at stage 'ipc-copy' \\(failure injection\\)");
}

TEST(KillAtStageTest, NoStageIsNoHook) { EXPECT_FALSE(KillAtStage("", "x")); }

}  // namespace
}  // namespace oscarkv::testing
