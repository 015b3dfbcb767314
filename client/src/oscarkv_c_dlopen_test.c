/* liboscarkv_c.so loaded with dlopen() (no link-time dependency, as an FFI user loads it), then
 * a round trip of built pages through a real oscarkvd that this program starts on 127.0.0.1:
 * build pages with the page builder, store, per-key existence, load into caller buffers (bytes
 * equal), decode, a corrupt page refused with a non-OK store, pinned lookup + release, delete.
 * Once over the default data path (shared memory on this host) and once over gRPC.
 *
 *   client_c_dlopen_test LIBOSCARKV_C_SO OSCARKVD */
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "oscarkv/client/oscarkv_c.h"

static int failures = 0;
static const char* (*p_last_error)(void);
#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
              #cond, p_last_error ? p_last_error() : "?");                             \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

/* Every entry point this test uses, resolved by name. */
#define OSCARKV_FNS(X)                                                                   \
  X(abi_version) X(status_name) X(connect_options_init) X(connect) X(close)              \
  X(uses_shm) X(register_builtin_codec) X(builtin_profile) X(page_size) X(build_page)    \
  X(decode_page) X(block_keys) X(store) X(exists) X(lookup) X(load) X(lookup_pinned)     \
  X(lease_deadline_ms) X(release) X(delete) X(tls_options_init) X(connect_tls)
#define DECLARE(name) static __typeof__(&oscarkv_##name) p_##name;
OSCARKV_FNS(DECLARE)

static int load_library(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return 1;
  }
  p_last_error = (const char* (*)(void))dlsym(lib, "oscarkv_last_error");
#define RESOLVE(name)                                               \
  *(void**)(&p_##name) = dlsym(lib, "oscarkv_" #name);              \
  if (p_##name == NULL) {                                           \
    fprintf(stderr, "%s lacks oscarkv_%s\n", path, #name);          \
    return 1;                                                       \
  }
  OSCARKV_FNS(RESOLVE)
  /* Only the C ABI is exported: an internal C++ symbol must not be visible. */
  CHECK(dlsym(lib, "_ZN7oscarkv14BuiltinProfileESt17basic_string_viewIcSt11char_traitsIcEE") ==
        NULL);
  return p_last_error == NULL;
}

/* Starts oscarkvd on 127.0.0.1:0 and returns its pid; `addr` receives its listen address. */
static pid_t start_daemon(const char* oscarkvd, char* addr, size_t cap) {
  int fds[2];
  char shm[64], line[512];
  size_t len = 0;
  pid_t pid;
  if (pipe(fds) != 0) return -1;
  snprintf(shm, sizeof shm, "oscarkv-dlopen-%d-%ld", (int)getpid(), (long)time(NULL));
  pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execl(oscarkvd, oscarkvd, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--pool-mb",
          "32", "--shm-name", shm, "--log-level", "warn", (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  /* Read the one ready line, 30 s at most. */
  while (len + 1 < sizeof line) {
    struct pollfd pfd = {fds[0], POLLIN, 0};
    ssize_t n;
    if (poll(&pfd, 1, 30000) <= 0) break;
    n = read(fds[0], line + len, 1);
    if (n <= 0 || line[len] == '\n') break;
    ++len;
  }
  line[len] = 0;
  close(fds[0]);
  {
    const char* at = strstr(line, " listen=");
    size_t n = 0;
    if (strncmp(line, "oscarkvd ready ", 15) != 0 || at == NULL) {
      fprintf(stderr, "no ready line from oscarkvd: '%s'\n", line);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      return -1;
    }
    at += 8;
    while (at[n] != 0 && at[n] != ' ' && n + 1 < cap) ++n;
    memcpy(addr, at, n);
    addr[n] = 0;
  }
  return pid;
}

static float rnd(unsigned* s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
}

enum { kPages = 4 };

static void round_trip(const char* addr, int data_path) {
  oscarkv_connect_options opts;
  oscarkv_client* c = NULL;
  oscarkv_codec codec;
  oscarkv_codec_profile prof;
  oscarkv_page pages[kPages + 1];
  oscarkv_store_result res;
  oscarkv_lease* lease = NULL;
  uint8_t keys[16 * (kPages + 1)], present[kPages + 1];
  uint32_t tokens[64 * (kPages + 1)];
  void* built[kPages];
  void* dst[kPages];
  size_t cap[kPages], n_keys = 0, n_rows, i, j;
  uint64_t sizes[kPages], int2_bytes = 0, bf16_bytes = 0;
  uint32_t matched = 99, deleted = 0, tc = 0;
  int codes[kPages + 1], kind = 0;
  unsigned seed = 12345u + (unsigned)data_path;
  float *rows, *decoded;

  p_connect_options_init(&opts);
  opts.address = addr;
  opts.data_path = data_path;
  CHECK(p_connect(&opts, &c) == OSCARKV_OK);
  if (c == NULL) return;
  CHECK(p_uses_shm(c) == (data_path != OSCARKV_PATH_GRPC));
  CHECK(p_builtin_profile("refmodel", &prof) == OSCARKV_OK);
  CHECK(p_register_builtin_codec(c, "refmodel", &codec) == OSCARKV_OK);
  CHECK(p_page_size(&prof, OSCARKV_PAGE_INT2, &int2_bytes) == OSCARKV_OK);
  CHECK(p_page_size(&prof, OSCARKV_PAGE_BF16, &bf16_bytes) == OSCARKV_OK);
  CHECK(int2_bytes == codec.int2_page_bytes && bf16_bytes == codec.bf16_page_bytes);

  /* K/V rows of one page: [layers][2][64 tokens][kv_heads][head_dim] f32. */
  n_rows = (size_t)prof.num_layers * 2 * 64 * prof.num_kv_heads * prof.head_dim;
  rows = malloc(n_rows * sizeof(float));
  decoded = malloc(n_rows * sizeof(float));
  for (i = 0; i < 64 * (kPages + 1); ++i) tokens[i] = (uint32_t)(7919u * i + (unsigned)data_path);
  CHECK(p_block_keys(&codec, "", 0, tokens, 64 * (kPages + 1), keys, kPages + 1, &n_keys) ==
        OSCARKV_OK);
  CHECK(n_keys == kPages + 1);
  for (i = 0; i < kPages; ++i) {
    const int k = i == 0 ? OSCARKV_PAGE_BF16 : OSCARKV_PAGE_INT2; /* a sink page, then history */
    const size_t bytes = (size_t)(k == OSCARKV_PAGE_INT2 ? int2_bytes : bf16_bytes);
    for (j = 0; j < n_rows; ++j) rows[j] = rnd(&seed);
    built[i] = malloc(bytes);
    CHECK(p_build_page(&prof, NULL, k, OSCARKV_DTYPE_F32, rows, 64, built[i], bytes) ==
          OSCARKV_OK);
    if (i == 1) { /* decoded INT2 rows are within scale/2 <= 4/3/2 of the input */
      float worst = 0;
      CHECK(p_decode_page(&prof, built[i], bytes, decoded, n_rows, &tc, &kind) == OSCARKV_OK);
      CHECK(tc == 64 && kind == OSCARKV_PAGE_INT2);
      for (j = 0; j < n_rows; ++j) {
        float e = decoded[j] - rows[j];
        if (e < 0) e = -e;
        if (e > worst) worst = e;
      }
      CHECK(worst > 0.0f && worst <= 0.67f);
    }
    pages[i].key = keys + 16 * i;
    pages[i].kind = k;
    pages[i].data = built[i];
    pages[i].bytes = bytes;
    dst[i] = malloc(bytes);
    cap[i] = bytes;
  }
  CHECK(p_build_page(&prof, NULL, OSCARKV_PAGE_INT2, OSCARKV_DTYPE_F32, rows, 65, built[1],
                     (size_t)int2_bytes) == OSCARKV_E_INVALID_ARGUMENT);

  CHECK(p_store(c, &codec, pages, kPages, &res, codes) == OSCARKV_OK);
  CHECK(res.stored == kPages && res.failed == 0 && res.first_error == OSCARKV_OK);
  CHECK(codes[0] == OSCARKV_OK && codes[kPages - 1] == OSCARKV_OK);
  CHECK(p_store(c, &codec, pages, 1, &res, codes) == OSCARKV_OK); /* again: deduplicated */
  CHECK(res.deduplicated == 1 && codes[0] == OSCARKV_E_ALREADY_EXISTS);

  CHECK(p_exists(c, &codec, keys, kPages + 1, present) == OSCARKV_OK);
  for (i = 0; i < kPages; ++i) CHECK(present[i] == 1);
  CHECK(present[kPages] == 0);
  CHECK(p_lookup(c, &codec, keys, kPages + 1, &matched) == OSCARKV_OK && matched == kPages);

  matched = 0;
  CHECK(p_load(c, &codec, keys, kPages, dst, cap, &matched, sizes) == OSCARKV_OK);
  CHECK(matched == kPages);
  for (i = 0; i < kPages; ++i) {
    CHECK(sizes[i] == cap[i]);
    CHECK(memcmp(dst[i], built[i], cap[i]) == 0);
  }

  /* A corrupt page (one payload byte changed after the checksum) is not stored, and the store
   * says so with a non-OK status. */
  {
    uint8_t* bad = malloc((size_t)int2_bytes);
    memcpy(bad, built[1], (size_t)int2_bytes);
    bad[1000] ^= 0x5A;
    pages[kPages].key = keys + 16 * kPages;
    pages[kPages].kind = OSCARKV_PAGE_INT2;
    pages[kPages].data = bad;
    pages[kPages].bytes = (size_t)int2_bytes;
    {
      const int rc = p_store(c, &codec, pages + kPages, 1, &res, codes);
      CHECK(rc == OSCARKV_E_DATA_LOSS);
      CHECK(strlen(p_last_error()) > 0);
    }
    CHECK(res.failed == 1 && res.stored == 0 && res.first_error == OSCARKV_E_DATA_LOSS);
    CHECK(codes[0] == OSCARKV_E_DATA_LOSS);
    present[0] = 9;
    CHECK(p_exists(c, &codec, keys + 16 * kPages, 1, present) == OSCARKV_OK && present[0] == 0);
    /* A page of the wrong size: INVALID_ARGUMENT for that page. */
    pages[kPages].bytes = 100;
    CHECK(p_store(c, &codec, pages + kPages, 1, &res, NULL) == OSCARKV_E_INVALID_ARGUMENT);
    free(bad);
  }

  /* A pinned lookup: the lease has a deadline; releasing it frees it. */
  CHECK(p_lookup_pinned(c, &codec, keys, kPages, 0, &matched, &lease) == OSCARKV_OK);
  CHECK(matched == kPages && lease != NULL);
  CHECK(p_lease_deadline_ms(lease) > 0);
  CHECK(p_release(c, lease) == OSCARKV_OK);

  /* Delete: the first two keys go, the rest stay; a second delete finds nothing. */
  CHECK(p_delete(c, &codec, keys, 2, codes, &deleted) == OSCARKV_OK);
  CHECK(deleted == 2 && codes[0] == OSCARKV_OK && codes[1] == OSCARKV_OK);
  CHECK(p_delete(c, &codec, keys, 1, codes, &deleted) == OSCARKV_OK);
  CHECK(deleted == 0 && codes[0] == OSCARKV_E_NOT_FOUND);
  CHECK(p_exists(c, &codec, keys, kPages, present) == OSCARKV_OK);
  CHECK(present[0] == 0 && present[1] == 0 && present[2] == 1 && present[3] == 1);
  matched = 99;
  CHECK(p_load(c, &codec, keys, kPages, dst, cap, &matched, NULL) == OSCARKV_OK && matched == 0);

  for (i = 0; i < kPages; ++i) {
    free(built[i]);
    free(dst[i]);
  }
  free(rows);
  free(decoded);
  p_close(c);
}

int main(int argc, char** argv) {
  char addr[256];
  pid_t daemon;
  int st = 0;
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIBOSCARKV_C_SO OSCARKVD\n", argv[0]);
    return 2;
  }
  if (load_library(argv[1]) != 0) return 1;
  CHECK(p_abi_version() == OSCARKV_ABI_VERSION);
  CHECK(strcmp(p_status_name(OSCARKV_E_DATA_LOSS), "DATA_LOSS") == 0);
  daemon = start_daemon(argv[2], addr, sizeof addr);
  if (daemon < 0) return 1;
  round_trip(addr, OSCARKV_PATH_AUTO);
  round_trip(addr, OSCARKV_PATH_GRPC);
  kill(daemon, SIGTERM);
  waitpid(daemon, &st, 0);
  if (failures == 0) printf("oscarkv C ABI via dlopen: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
