// A tenant's client in a process of its own uid, for tenant_shm_test: the local socket knows a
// peer by its uid, so a second tenant on one host needs a second uid (the test runs this as
// root and it drops to `uid` before anything else).
//
//   tenant_shm_probe UID ADDRESS CERT_DIR NAMESPACE OUT_FILE KEY_HEX...
//
// Connects with CERT_DIR/{ca.pem,client.pem,client.key} (NAMESPACE "-" = the tenant's own) on
// the shared-memory data path only, registers the refmodel codec and loads the keys. Prints
// "data_path=<shm|grpc> code=<status code> matched=<n>" and writes the loaded pages,
// concatenated, to OUT_FILE. Exit 0 when it got that far, 2 on bad arguments, 3 when the uid
// could not be taken.
#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "oscarkv/client/client.h"
#include "oscarkv/kernels/codec_profile.h"

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s UID ADDRESS CERT_DIR NAMESPACE OUT_FILE KEY_HEX...\n", argv[0]);
    return 2;
  }
  const uid_t uid = static_cast<uid_t>(std::strtoul(argv[1], nullptr, 10));
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) return 3;
  const std::string dir = argv[3], ns = argv[4];
  oscarkv::client::ConnectOptions o;
  o.address = argv[2];
  o.rpc_timeout_ms = 5000;
  o.tls_ca_file = dir + "/ca.pem";
  o.tls_cert_file = dir + "/client.pem";
  o.tls_key_file = dir + "/client.key";
  o.shared_namespace = ns == "-" ? "" : ns;
  o.data_path = oscarkv::client::DataPath::kSharedMemory;
  std::vector<oscarkv::BlockKey> keys;
  for (int i = 6; i < argc; ++i) {
    const std::string hex = argv[i];
    oscarkv::BlockKey k;
    if (hex.size() != 2 * k.bytes.size() ||
        hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      return 2;
    }
    const std::string raw = absl::HexStringToBytes(hex);
    std::copy(raw.begin(), raw.end(), k.bytes.begin());
    keys.push_back(k);
  }
  auto report = [](const char* path, int code, uint32_t matched) {
    std::printf("data_path=%s code=%d matched=%u\n", path, code, matched);
    return 0;
  };
  auto c = oscarkv::client::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    return report("none", static_cast<int>(c.status().code()), 0);
  }
  const char* path = oscarkv::client::DataPathName((*c)->server().data_path);
  auto codec = (*c)->RegisterCodec(*oscarkv::BuiltinProfile("refmodel"));
  if (!codec.ok()) return report(path, static_cast<int>(codec.status().code()), 0);
  auto loaded = (*c)->Load(*codec, keys);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return report(path, static_cast<int>(loaded.status().code()), 0);
  }
  std::ofstream out(argv[5], std::ios::binary);
  for (const auto& p : loaded->pages) out.write(reinterpret_cast<const char*>(p.data()), p.size());
  return report(path, 0, loaded->matched);
}
