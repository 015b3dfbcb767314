/* The C ABI compiled as C99. Without arguments: the daemon-free parts (block keys against the
 * golden vectors of docs/FORMAT.md §3.1, argument checks, connecting to nothing). With a daemon
 * address as argv[1] (tests/ runs it so): register, lookup, load of a miss, stats. With
 * `ADDR --tls DIR` (tests/tls_test): mTLS connects, refusals and calls. With
 * `ADDR --tenants DIR` (tests/tenants_test): the shared namespace "common" of its members. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscarkv/client/oscarkv_c.h"

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, \
              __LINE__, #cond, oscarkv_last_error());                          \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static void hex(const uint8_t* b, char* out) {
  int i;
  for (i = 0; i < 16; ++i) sprintf(out + 2 * i, "%02x", b[i]);
}

static void from_hex(const char* s, uint8_t* out) {
  int i;
  for (i = 0; i < 16; ++i) {
    unsigned v;
    sscanf(s + 2 * i, "%2x", &v);
    out[i] = (uint8_t)v;
  }
}

static int daemon_free_checks(void) {
  oscarkv_codec codec;
  uint32_t tokens[150];
  uint8_t keys[16 * 4];
  size_t n = 0;
  char h[33];
  oscarkv_client* c = NULL;
  oscarkv_connect_options opts;
  unsigned i;

  memset(&codec, 0, sizeof codec);
  from_hex("4be25704bf3761cb7196d7029b0c67ed", codec.codec_id); /* qwen3-8b */
  codec.page_tokens = 64;
  for (i = 0; i < 150; ++i) tokens[i] = i;
  CHECK(oscarkv_block_keys(&codec, "", 0, tokens, 150, keys, 4, &n) == OSCARKV_OK);
  CHECK(n == 2);
  hex(keys, h);
  CHECK(strcmp(h, "5d55a8bf9ffbceec922d5a1b7acc1d7f") == 0);
  hex(keys + 16, h);
  CHECK(strcmp(h, "10cb911c588a67c541fd440aa76e9779") == 0);
  CHECK(oscarkv_block_keys(&codec, "tenant-a", 8, tokens, 128, keys, 1, &n) == OSCARKV_OK);
  CHECK(n == 2); /* two full blocks, only max_keys = 1 written */
  hex(keys, h);
  CHECK(strcmp(h, "db9f58cfc2462c86ab995409005f7b67") == 0);
  CHECK(oscarkv_block_keys(NULL, "", 0, tokens, 150, keys, 4, &n) == OSCARKV_E_INVALID_ARGUMENT);
  CHECK(strlen(oscarkv_last_error()) > 0);

  {
    oscarkv_codec_profile prof;
    uint8_t id[16];
    uint64_t bytes = 0;
    CHECK(oscarkv_abi_version() == OSCARKV_ABI_VERSION);
    CHECK(strcmp(oscarkv_status_name(OSCARKV_E_NOT_FOUND), "NOT_FOUND") == 0);
    CHECK(strcmp(oscarkv_status_name(99), "UNKNOWN_CODE") == 0);
    CHECK(oscarkv_builtin_profile("qwen3-8b", &prof) == OSCARKV_OK);
    CHECK(strcmp(prof.model_id, "Qwen/Qwen3-8B") == 0 && prof.num_layers == 36);
    CHECK(oscarkv_codec_id(&prof, id) == OSCARKV_OK);
    hex(id, h);
    CHECK(strcmp(h, "4be25704bf3761cb7196d7029b0c67ed") == 0);
    memset(prof.rotation_digest, 1, 32);
    CHECK(oscarkv_codec_id(&prof, id) == OSCARKV_OK);
    hex(id, h);
    CHECK(strcmp(h, "b0f7827f2a02f7c99e053faac7c79e14") == 0);
    CHECK(oscarkv_page_size(&prof, OSCARKV_PAGE_INT2, &bytes) == OSCARKV_OK);
    CHECK(bytes == 1327168);
    CHECK(oscarkv_page_size(&prof, OSCARKV_PAGE_BF16, &bytes) == OSCARKV_OK);
    CHECK(bytes == 9437248);
    CHECK(oscarkv_page_size(&prof, 3, &bytes) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(oscarkv_builtin_profile("refmodel", &prof) == OSCARKV_OK);
    CHECK(oscarkv_codec_id(&prof, id) == OSCARKV_OK);
    hex(id, h);
    CHECK(strcmp(h, "c5bc90c8c91954515b762ed6bedbf267") == 0);
    prof.head_dim = 100;
    CHECK(oscarkv_codec_id(&prof, id) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(oscarkv_builtin_profile("nope", &prof) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(strstr(oscarkv_last_error(), "nope") != NULL);
  }
  {
    /* A rotation set: identity rotations digest like RotationSet::Identity; a non-orthogonal
     * matrix and an unknown range mode are refused; a page built with a rotation whose digest
     * is not the profile's is refused. */
    enum { L = 1, H = 1, D = 64 };
    static float m[L * 2 * H * D * D];
    float clips[L * 2 * H] = {1.0f, 0.9f};
    uint8_t modes[L * 2 * H] = {0, 2};
    uint8_t digest[32], zero[32];
    oscarkv_rotation* rot = NULL;
    int j;
    for (j = 0; j < 2 * D; ++j) m[(j / D) * D * D + (j % D) * D + j % D] = 1.0f;
    CHECK(oscarkv_rotation_create(L, H, D, m, clips, NULL, &rot) == OSCARKV_OK && rot != NULL);
    memset(zero, 0, 32);
    CHECK(oscarkv_rotation_digest(rot, digest) == OSCARKV_OK && memcmp(digest, zero, 32) != 0);
    oscarkv_rotation_free(rot);
    rot = NULL;
    CHECK(oscarkv_rotation_create(L, H, D, m, clips, modes, &rot) ==
          OSCARKV_E_INVALID_ARGUMENT);
    CHECK(rot == NULL && strstr(oscarkv_last_error(), "range mode") != NULL);
    m[1] = 0.5f;
    CHECK(oscarkv_rotation_create(L, H, D, m, clips, NULL, &rot) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(strstr(oscarkv_last_error(), "orthogonal") != NULL);
    oscarkv_rotation_free(NULL);
  }

  oscarkv_connect_options_init(&opts);
  CHECK(opts.verify_checksums == 1);
  opts.address = "127.0.0.1:1";
  opts.rpc_timeout_ms = 3000;
  {
    int rc = oscarkv_connect(&opts, &c);
    CHECK(rc == OSCARKV_E_UNAVAILABLE || rc == OSCARKV_E_DEADLINE_EXCEEDED);
  }
  CHECK(c == NULL);
  CHECK(strstr(oscarkv_last_error(), "127.0.0.1:1") != NULL);
  opts.data_path = 7;
  CHECK(oscarkv_connect(&opts, &c) == OSCARKV_E_INVALID_ARGUMENT);
  CHECK(strstr(oscarkv_last_error(), "data_path") != NULL);
  opts.data_path = OSCARKV_PATH_AUTO;
  opts.lookup_path = 9;
  CHECK(oscarkv_connect(&opts, &c) == OSCARKV_E_INVALID_ARGUMENT);
  CHECK(strstr(oscarkv_last_error(), "lookup_path") != NULL);
  CHECK(oscarkv_uses_local_lookups(NULL) == 0);
  {
    oscarkv_tls_options tls;
    opts.lookup_path = OSCARKV_LOOKUP_AUTO;
    oscarkv_tls_options_init(&tls);
    CHECK(tls.struct_size == sizeof tls && tls.ca_file == NULL);
    tls.struct_size = sizeof tls - 1; /* a header this library does not know */
    CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(strstr(oscarkv_last_error(), "struct_size") != NULL && c == NULL);
    oscarkv_tls_options_init(&tls);
    tls.cert_file = "client.pem"; /* a certificate without the CA to check the daemon's */
    CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_E_INVALID_ARGUMENT);
    CHECK(strstr(oscarkv_last_error(), "tls_ca_file") != NULL && c == NULL);
  }
  oscarkv_close(NULL);
  return 0;
}

static int with_daemon(const char* addr) {
  oscarkv_connect_options opts;
  oscarkv_client* c = NULL;
  oscarkv_codec codec;
  oscarkv_stats st;
  uint32_t tokens[256];
  uint8_t keys[16 * 4];
  size_t n = 0;
  uint32_t matched = 99;
  unsigned i;
  void* dst[4];
  size_t cap[4];

  oscarkv_connect_options_init(&opts);
  opts.address = addr;
  CHECK(oscarkv_connect(&opts, &c) == OSCARKV_OK);
  if (c == NULL) return 1;
  CHECK(oscarkv_register_builtin_codec(c, "refmodel", &codec) == OSCARKV_OK);
  CHECK(codec.int2_page_bytes == 64 + 8 * 2 * 2 * 2304);
  CHECK(oscarkv_register_builtin_codec(c, "no-such-shape", &codec) == OSCARKV_E_INVALID_ARGUMENT);
  for (i = 0; i < 256; ++i) tokens[i] = 1000003u * i;
  CHECK(oscarkv_block_keys(&codec, "", 0, tokens, 256, keys, 4, &n) == OSCARKV_OK && n == 4);
  CHECK(oscarkv_lookup(c, &codec, keys, 4, &matched) == OSCARKV_OK);
  CHECK(matched == 0);
  for (i = 0; i < 4; ++i) {
    cap[i] = (size_t)codec.int2_page_bytes;
    dst[i] = malloc(cap[i]);
  }
  matched = 99;
  CHECK(oscarkv_load(c, &codec, keys, 4, dst, cap, &matched, NULL) == OSCARKV_OK);
  CHECK(matched == 0);
  for (i = 0; i < 4; ++i) free(dst[i]);
  CHECK(oscarkv_stats_get(c, &st) == OSCARKV_OK);
  CHECK(st.pool_bytes > 0);
  CHECK(st.lookups >= 1);
  /* The default (auto) client on this host looks up over the daemon's local socket. */
  CHECK(oscarkv_uses_local_lookups(c) == 1);
  oscarkv_close(c);

  /* Forced gRPC lookups give the same answer. */
  c = NULL;
  opts.lookup_path = OSCARKV_LOOKUP_GRPC;
  CHECK(oscarkv_connect(&opts, &c) == OSCARKV_OK);
  if (c == NULL) return 1;
  CHECK(oscarkv_uses_local_lookups(c) == 0);
  CHECK(oscarkv_register_builtin_codec(c, "refmodel", &codec) == OSCARKV_OK);
  matched = 99;
  CHECK(oscarkv_lookup(c, &codec, keys, 4, &matched) == OSCARKV_OK);
  CHECK(matched == 0);
  oscarkv_close(c);

  c = NULL;
  opts.lookup_path = OSCARKV_LOOKUP_LOCAL;
  CHECK(oscarkv_connect(&opts, &c) == OSCARKV_OK);
  if (c == NULL) return 1;
  CHECK(oscarkv_uses_local_lookups(c) == 1);
  oscarkv_close(c);
  return 0;
}

/* Against a daemon with --tls-client-ca: `dir` holds the PKI of tests/tls_pki.h (ca.pem,
 * client.{pem,key} of that CA, stranger.{pem,key} of another). */
static int with_tls_daemon(const char* addr, const char* dir) {
  char ca[512], cert[512], key[512], scert[512], skey[512];
  oscarkv_connect_options opts;
  oscarkv_tls_options tls;
  oscarkv_client* c = NULL;
  oscarkv_codec codec;
  oscarkv_stats st;
  uint32_t tokens[64];
  uint8_t keys[16];
  size_t n = 0;
  uint32_t matched = 99;
  unsigned i;

  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(cert, sizeof cert, "%s/client.pem", dir);
  snprintf(key, sizeof key, "%s/client.key", dir);
  snprintf(scert, sizeof scert, "%s/stranger.pem", dir);
  snprintf(skey, sizeof skey, "%s/stranger.key", dir);
  oscarkv_connect_options_init(&opts);
  opts.address = addr;
  opts.rpc_timeout_ms = 5000;
  opts.lookup_path = OSCARKV_LOOKUP_GRPC;
  /* Plaintext, TLS without a client certificate, another CA's certificate: refused. */
  CHECK(oscarkv_connect(&opts, &c) != OSCARKV_OK && c == NULL);
  oscarkv_tls_options_init(&tls);
  tls.ca_file = ca;
  CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_E_UNAVAILABLE && c == NULL);
  tls.cert_file = scert;
  tls.key_file = skey;
  CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_E_UNAVAILABLE && c == NULL);
  tls.key_file = "/nonexistent/client.key";
  tls.cert_file = cert;
  CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_E_NOT_FOUND && c == NULL);
  /* The configured CA's client: served. */
  tls.key_file = key;
  CHECK(oscarkv_connect_tls(&opts, &tls, &c) == OSCARKV_OK);
  if (c == NULL) return 1;
  CHECK(oscarkv_register_builtin_codec(c, "refmodel", &codec) == OSCARKV_OK);
  for (i = 0; i < 64; ++i) tokens[i] = 7u * i + 1;
  CHECK(oscarkv_block_keys(&codec, "", 0, tokens, 64, keys, 1, &n) == OSCARKV_OK && n == 1);
  CHECK(oscarkv_lookup(c, &codec, keys, 1, &matched) == OSCARKV_OK && matched == 0);
  CHECK(oscarkv_stats_get(c, &st) == OSCARKV_OK && st.lookups >= 1);
  oscarkv_close(c);
  return 0;
}

/* tenants_test's daemon (shared namespace "common" of tenant-a and tenant-b; `dir` holds its
 * PKI: ca.pem, tenant-a/tenant-b/uri .pem/.key, uri being a tenant outside "common"). */
static oscarkv_client* tenant_client(const char* addr, const char* dir, const char* who,
                                     const char* ns, size_t struct_size, int* code) {
  char ca[512], cert[512], key[512];
  oscarkv_connect_options opts;
  oscarkv_tls_options tls;
  oscarkv_client* c = NULL;
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(cert, sizeof cert, "%s/%s.pem", dir, who);
  snprintf(key, sizeof key, "%s/%s.key", dir, who);
  oscarkv_connect_options_init(&opts);
  opts.address = addr;
  opts.rpc_timeout_ms = 5000;
  oscarkv_tls_options_init(&tls);
  tls.ca_file = ca;
  tls.cert_file = cert;
  tls.key_file = key;
  tls.shared_namespace = ns;
  tls.struct_size = struct_size;
  *code = oscarkv_connect_tls(&opts, &tls, &c);
  return c;
}

static int with_tenants_daemon(const char* addr, const char* dir) {
  const size_t abi3_size = offsetof(oscarkv_tls_options, shared_namespace);
  oscarkv_client *a, *b, *own, *c;
  oscarkv_codec codec;
  oscarkv_codec_profile prof;
  oscarkv_page page;
  oscarkv_store_result res;
  uint32_t tokens[64];
  uint8_t key[16];
  uint64_t bytes = 0;
  uint32_t matched = 99;
  float* rows;
  void* buf;
  void* dst;
  size_t n = 0, cap, nrows;
  int code = -1;
  unsigned i;

  a = tenant_client(addr, dir, "tenant-a", "common", sizeof(oscarkv_tls_options), &code);
  CHECK(code == OSCARKV_OK && a != NULL);
  b = tenant_client(addr, dir, "tenant-b", "common", sizeof(oscarkv_tls_options), &code);
  CHECK(code == OSCARKV_OK && b != NULL);
  /* An ABI 3 caller's struct (no shared_namespace field): its tenant's own namespace. */
  own = tenant_client(addr, dir, "tenant-b", "ignored-past-abi3-size", abi3_size, &code);
  CHECK(code == OSCARKV_OK && own != NULL);
  if (a == NULL || b == NULL || own == NULL) return 1;

  CHECK(oscarkv_builtin_profile("refmodel", &prof) == OSCARKV_OK);
  CHECK(oscarkv_page_size(&prof, OSCARKV_PAGE_INT2, &bytes) == OSCARKV_OK);
  CHECK(oscarkv_register_builtin_codec(a, "refmodel", &codec) == OSCARKV_OK);
  nrows = (size_t)prof.num_layers * 2 * prof.page_tokens * prof.num_kv_heads * prof.head_dim;
  rows = malloc(nrows * sizeof *rows);
  buf = malloc((size_t)bytes);
  dst = malloc((size_t)bytes);
  if (rows == NULL || buf == NULL || dst == NULL) return 1;
  for (i = 0; i < nrows; ++i) rows[i] = (float)((int)(i % 17) - 8) / 8.0f;
  CHECK(oscarkv_build_page(&prof, NULL, OSCARKV_PAGE_INT2, OSCARKV_DTYPE_F32, rows,
                           prof.page_tokens, buf, (size_t)bytes) == OSCARKV_OK);
  for (i = 0; i < 64; ++i) tokens[i] = 31u * i + 5;
  CHECK(oscarkv_block_keys(&codec, "", 0, tokens, 64, key, 1, &n) == OSCARKV_OK && n == 1);
  page.key = key;
  page.kind = OSCARKV_PAGE_INT2;
  page.data = buf;
  page.bytes = (size_t)bytes;
  /* tenant-a stores in "common"; tenant-b (in "common") finds and loads the same bytes. */
  CHECK(oscarkv_store(a, &codec, &page, 1, &res, NULL) == OSCARKV_OK && res.stored == 1);
  CHECK(oscarkv_lookup(a, &codec, key, 1, &matched) == OSCARKV_OK && matched == 1);
  CHECK(oscarkv_register_builtin_codec(b, "refmodel", &codec) == OSCARKV_OK);
  matched = 99;
  CHECK(oscarkv_lookup(b, &codec, key, 1, &matched) == OSCARKV_OK && matched == 1);
  cap = (size_t)bytes;
  matched = 99;
  CHECK(oscarkv_load(b, &codec, key, 1, &dst, &cap, &matched, NULL) == OSCARKV_OK);
  CHECK(matched == 1 && memcmp(dst, buf, (size_t)bytes) == 0);
  /* Outside the namespace, tenant-b's own keys do not see it. */
  CHECK(oscarkv_register_builtin_codec(own, "refmodel", &codec) == OSCARKV_OK);
  matched = 99;
  CHECK(oscarkv_lookup(own, &codec, key, 1, &matched) == OSCARKV_OK && matched == 0);
  /* A tenant outside "common", or a name no config has: refused at connect. */
  c = tenant_client(addr, dir, "uri", "common", sizeof(oscarkv_tls_options), &code);
  CHECK(code == OSCARKV_E_PERMISSION_DENIED && c == NULL);
  c = tenant_client(addr, dir, "tenant-a", "no-such-ns", sizeof(oscarkv_tls_options), &code);
  CHECK(code == OSCARKV_E_PERMISSION_DENIED && c == NULL);
  /* A struct size neither ABI 3 nor 4 knows. */
  c = tenant_client(addr, dir, "tenant-a", "common", abi3_size + 1, &code);
  CHECK(code == OSCARKV_E_INVALID_ARGUMENT && c == NULL);
  /* Unregistering: tenant-a (own namespace) cannot reach tenant-b's registration there. */
  c = tenant_client(addr, dir, "tenant-a", "", sizeof(oscarkv_tls_options), &code);
  CHECK(code == OSCARKV_OK && c != NULL);
  if (c != NULL) {
    CHECK(oscarkv_unregister_codec(c, &codec, 1, &bytes) == OSCARKV_E_NOT_FOUND);
    oscarkv_close(c);
  }
  matched = 99;
  CHECK(oscarkv_lookup(own, &codec, key, 1, &matched) == OSCARKV_OK && matched == 0);
  CHECK(oscarkv_unregister_codec(own, &codec, 0, &bytes) == OSCARKV_OK && bytes == 0);
  CHECK(oscarkv_unregister_codec(own, &codec, 0, NULL) == OSCARKV_E_NOT_FOUND);
  CHECK(oscarkv_lookup(own, &codec, key, 1, &matched) == OSCARKV_E_NOT_FOUND);
  /* In "common": tenant-a registered it, so tenant-b may not unregister it; tenant-a may not
   * while its page is there, and may with drop_pages (which deletes the page). */
  CHECK(oscarkv_unregister_codec(b, &codec, 1, NULL) == OSCARKV_E_PERMISSION_DENIED);
  CHECK(oscarkv_unregister_codec(a, &codec, 0, NULL) == OSCARKV_E_FAILED_PRECONDITION);
  CHECK(strstr(oscarkv_last_error(), "drop_pages") != NULL);
  CHECK(oscarkv_unregister_codec(a, &codec, 1, &bytes) == OSCARKV_OK && bytes == 1);
  CHECK(oscarkv_lookup(b, &codec, key, 1, &matched) == OSCARKV_E_NOT_FOUND);
  CHECK(oscarkv_unregister_codec(NULL, &codec, 0, NULL) == OSCARKV_E_INVALID_ARGUMENT);
  free(rows);
  free(buf);
  free(dst);
  oscarkv_close(a);
  oscarkv_close(b);
  oscarkv_close(own);
  return 0;
}

int main(int argc, char** argv) {
  daemon_free_checks();
  if (argc > 3 && strcmp(argv[2], "--tls") == 0) {
    with_tls_daemon(argv[1], argv[3]);
  } else if (argc > 3 && strcmp(argv[2], "--tenants") == 0) {
    with_tenants_daemon(argv[1], argv[3]);
  } else if (argc > 1) {
    with_daemon(argv[1]);
  }
  if (failures == 0) printf("oscarkv C ABI: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
