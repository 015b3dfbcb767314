// oscarkvd: the oscarkv node cache daemon. `oscarkvd --help` for options.
// Exit codes: 0 stopped cleanly (SIGTERM/SIGINT) or --help/--print-default-config, 1 it could
// not start or failed while running (one "oscarkvd: ..." line on stderr), 2 usage (a bad flag,
// flag value or config file).
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "oscarkv/service/config.h"
#include "oscarkv/service/daemon.h"
#include "oscarkv/service/log.h"
#ifdef OSCARKV_HAVE_UCX
#include "ucx_data_plane.h"
#endif

int main(int argc, char** argv) {
  using namespace oscarkv::service;
#ifdef OSCARKV_HAVE_UCX
  // The daemon re-executes itself as its isolated UCX data-plane process (ucx_data_plane.h).
  if (argc > 1 && std::string_view(argv[1]) == "--internal-ucx-data-plane") {
    return RunUcxDataPlaneChild(argc, argv);
  }
#endif
  BlockTerminationSignals();
  DaemonConfig config;
  if (absl::Status s = ApplyConfigYaml(DefaultConfigYaml(), "<embedded default>", &config);
      !s.ok()) {
    std::fprintf(stderr, "oscarkvd: internal error in the default config: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  auto action = ParseCommandLine(argc, argv, &config);
  if (!action.ok()) {
    std::fprintf(stderr, "oscarkvd: %s\n", std::string(action.status().message()).c_str());
    return 2;
  }
  if (*action == CommandLineAction::kHelp) {
    std::fputs(CommandLineHelp().c_str(), stdout);
    return 0;
  }
  if (*action == CommandLineAction::kVersion) {
    std::printf("oscarkvd %s\n", OSCARKV_VERSION);
    return 0;
  }
  if (*action == CommandLineAction::kPrintDefaultConfig) {
    std::fputs(DefaultConfigYaml().c_str(), stdout);
    return 0;
  }
  absl::Status s = RunDaemon(config);
  if (!s.ok()) {
    // One line a person reads (exit 1); structured lines are for events while running.
    std::fprintf(stderr, "oscarkvd: %s\n", std::string(s.message()).c_str());
  }
  // Everything is released (server drained, pool file removed). Skip static destructors: gRPC's
  // global shutdown can sit up to ~10 s in an idle poller's epoll timeout.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(s.ok() ? 0 : 1);
}
