// `oscarkv bench service`: lookups and loads of a local oscarkvd through the client library
// (see bench/service_bench.h). Without the client module it says so.
#include <cstdio>

#include "command.h"

// Set by the oscarkv_bench_service target, which exists only where the client module is built.
#ifdef OSCARKV_HAVE_SERVICE_BENCH
#include "service_bench.h"
#endif

namespace oscarkv::cli {
namespace {

int RunBenchService(int argc, char** argv) {
#ifdef OSCARKV_HAVE_SERVICE_BENCH
  return oscarkv::bench::ServiceBenchMain(argc, argv);
#else
  std::fprintf(stderr, "oscarkv bench service: this build has no client module\n");
  return 1;
#endif
}

}  // namespace

OSCARKV_COMMAND("bench service",
                "lookups/s and p50/p99 (local socket and gRPC side by side) and load GB/s (shm, "
                "gRPC) vs memcpy, of a local oscarkvd",
                RunBenchService);

}  // namespace oscarkv::cli
