// Test helper process: connects to oscarkvd, pins the given keys of the refmodel codec under a
// lease of the daemon's default length, prints "pinned N lease=ID" and then just waits (at most
// 60 s) -- the test kills it with SIGKILL so the lease is never released.
//   lease_holder [--lookup-path=auto|local|grpc] ADDR KEYHEX [KEYHEX...]
// The line ends with " path=local" or " path=grpc": the path the Lookup took.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "oscarkv/client/client.h"

int main(int argc, char** argv) {
  using namespace oscarkv;
  client::ConnectOptions o;
  const std::string flag = "--lookup-path=";
  if (argc > 1 && std::string(argv[1]).rfind(flag, 0) == 0) {
    const std::string p = std::string(argv[1]).substr(flag.size());
    o.lookup_path = p == "local" ? client::LookupPath::kLocal
                    : p == "grpc" ? client::LookupPath::kGrpc
                                  : client::LookupPath::kAuto;
    ++argv;
    --argc;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: lease_holder [--lookup-path=auto|local|grpc] ADDR KEYHEX...\n");
    return 2;
  }
  o.address = argv[1];
  o.client_name = "lease_holder";
  auto c = client::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "lease_holder: %s\n", c.status().ToString().c_str());
    return 1;
  }
  auto codec = (*c)->RegisterCodec(*BuiltinProfile("refmodel"));
  if (!codec.ok()) {
    std::fprintf(stderr, "lease_holder: %s\n", codec.status().ToString().c_str());
    return 1;
  }
  std::vector<BlockKey> keys;
  for (int i = 2; i < argc; ++i) keys.push_back(*BlockKey::FromHex(argv[i]));
  auto r = (*c)->Lookup(*codec, keys, {.pin = true});
  if (!r.ok()) {
    std::fprintf(stderr, "lease_holder: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("pinned %u lease=%llu path=%s\n", r->matched,
              static_cast<unsigned long long>(r->lease_ids.empty() ? 0 : r->lease_ids[0]),
              client::LookupPathName((*c)->server().lookup_path));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}
