/* The installed C ABI (oscarkv::c, liboscarkv_c.so): the FORMAT.md golden codec id and block key,
 * and a clear UNAVAILABLE from oscarkv_connect when no daemon listens. */
#include <stdio.h>
#include <string.h>

#include "oscarkv/client/oscarkv_c.h"

int main(void) {
  oscarkv_codec_profile prof;
  oscarkv_codec codec;
  oscarkv_connect_options opts;
  oscarkv_client* c = NULL;
  uint32_t tokens[64];
  uint8_t key[16];
  size_t n = 0;
  unsigned i;
  char hex[33];
  int rc;
  if (oscarkv_builtin_profile("qwen3-8b", &prof) != OSCARKV_OK ||
      oscarkv_codec_id(&prof, codec.codec_id) != OSCARKV_OK) {
    fprintf(stderr, "consumer_c: %s\n", oscarkv_last_error());
    return 1;
  }
  codec.page_tokens = prof.page_tokens;
  for (i = 0; i < 64; ++i) tokens[i] = i;
  if (oscarkv_block_keys(&codec, "", 0, tokens, 64, key, 1, &n) != OSCARKV_OK || n != 1) return 1;
  for (i = 0; i < 16; ++i) sprintf(hex + 2 * i, "%02x", key[i]);
  if (strcmp(hex, "5d55a8bf9ffbceec922d5a1b7acc1d7f") != 0) {
    fprintf(stderr, "consumer_c: wrong block key %s\n", hex);
    return 1;
  }
  oscarkv_connect_options_init(&opts);
  opts.address = "127.0.0.1:1";
  opts.rpc_timeout_ms = 2000;
  rc = oscarkv_connect(&opts, &c);
  if (rc != OSCARKV_E_UNAVAILABLE && rc != OSCARKV_E_DEADLINE_EXCEEDED) {
    fprintf(stderr, "consumer_c: unexpected connect result %d\n", rc);
    return 1;
  }
  printf("consumer_c: oscarkv C ABI package OK (key %s, %s)\n", hex, oscarkv_status_name(rc));
  return 0;
}
