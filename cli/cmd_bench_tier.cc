// `oscarkv bench tier`: the SSD tier beside plain file I/O (see bench/tier_bench.h).
#include <cstdio>

#include "command.h"

#if __has_include("tier_bench.h")
#include "tier_bench.h"
#define OSCARKV_HAVE_TIER_BENCH 1
#endif

namespace oscarkv::cli {
namespace {

int RunBenchTier(int argc, char** argv) {
#ifdef OSCARKV_HAVE_TIER_BENCH
  return oscarkv::bench::TierBenchMain(argc, argv);
#else
  std::fprintf(stderr, "oscarkv bench tier: this build has no service module\n");
  return 1;
#endif
}

}  // namespace

OSCARKV_COMMAND("bench tier",
                "SSD tier demotion/promotion GB/s beside plain fsync'd file I/O, restart time",
                RunBenchTier);

}  // namespace oscarkv::cli
