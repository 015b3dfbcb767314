#include "oscarkv/testing/stage_hooks.h"

#include <signal.h>

#include <cstdio>

namespace oscarkv::testing {

std::function<void(std::string_view)> KillAtStage(std::string stage, std::string who) {
  if (stage.empty()) return nullptr;
  return [stage = std::move(stage), who = std::move(who)](std::string_view at) {
    if (at != stage) return;
    std::fprintf(stderr, "%s: dying at stage '%s' (failure injection)\n", who.c_str(),
                 stage.c_str());
    std::fflush(stderr);
    ::raise(SIGKILL);
  };
}

}  // namespace oscarkv::testing
