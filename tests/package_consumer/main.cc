// Uses the installed C++ headers and oscarkv::client: block keys against the FORMAT.md golden
// vector, and a clear UNAVAILABLE from Connect when no daemon listens. (main_c.c does the same
// through the C ABI and oscarkv::c; main_both.cc uses both APIs through oscarkv::c_static.)
#include <cstdio>

#include "oscarkv/client/client.h"

int main() {
  using namespace oscarkv;
  client::Codec codec;
  codec.profile = *BuiltinProfile("qwen3-8b");
  codec.id = codec.profile.Id();
  std::vector<uint32_t> tokens(128);
  for (uint32_t i = 0; i < 128; ++i) tokens[i] = i;
  const auto keys = client::Client::BlockKeys(codec, tokens);
  if (keys.size() != 2 || keys[0].Hex() != "5d55a8bf9ffbceec922d5a1b7acc1d7f") {
    std::fprintf(stderr, "consumer: wrong block keys\n");
    return 1;
  }
  client::ConnectOptions o;
  o.address = "127.0.0.1:1";
  o.rpc_timeout_ms = 2000;
  auto c = client::Client::Connect(o);
  if (c.ok() || !absl::IsUnavailable(c.status()) && !absl::IsDeadlineExceeded(c.status())) {
    std::fprintf(stderr, "consumer: unexpected connect result\n");
    return 1;
  }
  std::printf("consumer: oscarkv package OK (key %s)\n", keys[0].Hex().c_str());
  return 0;
}
