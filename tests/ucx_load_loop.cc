// Test helper process: connects a UcxLoader to oscarkvd and loads the given refmodel keys by
// UCX RMA in a loop (at most 60 s), printing "loading" once the first load has succeeded -- the
// test kills it with SIGKILL mid-transfer and checks that the daemon keeps serving.
//   ucx_load_loop ADDR TLS KEYHEX [KEYHEX...]
#include <chrono>
#include <cstdio>
#include <string>

#include "oscarkv/client/ucx_loader.h"

int main(int argc, char** argv) {
  using namespace oscarkv;
  if (argc < 4) {
    std::fprintf(stderr, "usage: ucx_load_loop ADDR TLS KEYHEX...\n");
    return 2;
  }
  client::UcxLoaderOptions o;
  o.connect.address = argv[1];
  o.connect.data_path = client::DataPath::kGrpc;  // control plane only; pages come by UCX
  o.tls = argv[2];
  if (o.tls == "tcp") o.net_devices = "lo";
  o.buffer_bytes = 1 << 20;  // several RMA rounds per load: more time inside transfers
  auto loader = client::UcxLoader::Connect(o);
  if (!loader.ok()) {
    std::fprintf(stderr, "ucx_load_loop: %s\n", loader.status().ToString().c_str());
    return 1;
  }
  auto codec = (*loader)->handles().client().RegisterCodec(*BuiltinProfile("refmodel"));
  if (!codec.ok()) {
    std::fprintf(stderr, "ucx_load_loop: %s\n", codec.status().ToString().c_str());
    return 1;
  }
  std::vector<BlockKey> keys;
  for (int i = 3; i < argc; ++i) keys.push_back(*BlockKey::FromHex(argv[i]));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool announced = false;
  while (std::chrono::steady_clock::now() < end) {
    auto r = (*loader)->Load(*codec, keys);
    if (r.ok() && !announced) {
      std::printf("loading %u pages\n", r->matched);
      std::fflush(stdout);
      announced = true;
    }
  }
  return 0;
}
