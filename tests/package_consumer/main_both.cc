// The installed oscarkv::c_static beside oscarkv::client in one program: the C ABI and the C++
// API give the same block key (the FORMAT.md golden vector), and the program loads at all (with
// oscarkv::c in place of oscarkv::c_static the configure step fails; see oscarkv_c.h).
#include <cstdio>
#include <cstring>

#include "oscarkv/client/client.h"
#include "oscarkv/client/oscarkv_c.h"

int main() {
  using namespace oscarkv;
  client::Codec codec;
  codec.profile = *BuiltinProfile("qwen3-8b");
  codec.id = codec.profile.Id();
  std::vector<uint32_t> tokens(64);
  for (uint32_t i = 0; i < 64; ++i) tokens[i] = i;
  const auto keys = client::Client::BlockKeys(codec, tokens);

  oscarkv_codec_profile prof;
  oscarkv_codec cc;
  if (oscarkv_builtin_profile("qwen3-8b", &prof) != OSCARKV_OK ||
      oscarkv_codec_id(&prof, cc.codec_id) != OSCARKV_OK) {
    std::fprintf(stderr, "consumer_both: %s\n", oscarkv_last_error());
    return 1;
  }
  cc.page_tokens = prof.page_tokens;
  uint8_t key[16];
  size_t n = 0;
  if (oscarkv_block_keys(&cc, "", 0, tokens.data(), tokens.size(), key, 1, &n) != OSCARKV_OK ||
      n != 1 || keys.size() != 1 || std::memcmp(key, keys[0].bytes.data(), 16) != 0 ||
      keys[0].Hex() != "5d55a8bf9ffbceec922d5a1b7acc1d7f") {
    std::fprintf(stderr, "consumer_both: the C and C++ block keys differ\n");
    return 1;
  }
  std::printf("consumer_both: oscarkv::c_static beside oscarkv::client OK (key %s)\n",
              keys[0].Hex().c_str());
  return 0;
}
