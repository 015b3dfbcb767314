// `oscarkv bench transfer`: UCX page-batch bandwidth beside ucx_perftest and the P/D handoff,
// INT2 page set vs all-BF16 (see bench/transfer_bench.h). Without the transport module it says so.
#include <cstdio>

#include "command.h"

// Set by the oscarkv_bench_transfer target, which exists only where the transport module is built.
#ifdef OSCARKV_HAVE_TRANSFER_BENCH
#include "transfer_bench.h"
#endif

namespace oscarkv::cli {
namespace {

int RunBenchTransfer(int argc, char** argv) {
#ifdef OSCARKV_HAVE_TRANSFER_BENCH
  return oscarkv::bench::TransferBenchMain(argc, argv);
#else
  std::fprintf(stderr, "oscarkv bench transfer: this build has no transport module (UCX)\n");
  return 1;
#endif
}

}  // namespace

OSCARKV_COMMAND("bench transfer",
                "UCX page-batch GB/s vs ucx_perftest; 32K-token handoff INT2 vs BF16",
                RunBenchTransfer);

}  // namespace oscarkv::cli
