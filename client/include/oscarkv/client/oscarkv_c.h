/* oscarkv C ABI: the client library for engines written in C, Rust, Go, Python (ctypes/cffi)...
 *
 * Contract
 * - Handles are opaque. oscarkv_connect() creates an oscarkv_client that the caller owns and
 *   frees with oscarkv_close(); a handle may be used from many threads at once.
 * - Every function returning int returns OSCARKV_OK (0) or an error code, which is a gRPC /
 *   absl status code number (OSCARKV_E_*). The message of the last error on the CALLING THREAD
 *   is returned by oscarkv_last_error() (valid until the next call on that thread).
 * - All buffers are caller-owned; the library never keeps a pointer past the call, except the
 *   async calls, whose buffers must stay valid until their callback has run.
 * - Keys and codec ids are 16 raw bytes (docs/FORMAT.md §2-§3); pages are the page format
 *   bytes of §1. Page kinds: 1 = INT2, 2 = BF16.
 * - No C++ types cross this boundary; the header compiles as C99.
 * - Shipped as liboscarkv_c.so (CMake target oscarkv::c, installed with the `client` component);
 *   it exports only the oscarkv_* symbols below, so it can be dlopen()ed (Python ctypes/cffi,
 *   Rust, Go) next to any other copy of gRPC/abseil without symbol clashes. It carries its own
 *   copy of the client and of the oscarkv.proto stubs, so it cannot be loaded into a process
 *   that also has oscarkv::client: the shared libprotobuf aborts on the second registration of
 *   oscarkv.proto. A C++ program that uses both APIs links oscarkv::c_static (this ABI as a
 *   static library over the program's own oscarkv::client) instead; CMake refuses to generate
 *   a target that links oscarkv::c and oscarkv::client (property OSCARKV_C_STATIC_BESIDE_CLIENT).
 * - Functions marked "no daemon" (profiles, codec ids, block keys, rotations, the page builder)
 *   need no connection.
 */
#ifndef OSCARKV_CLIENT_OSCARKV_C_H_
#define OSCARKV_CLIENT_OSCARKV_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  OSCARKV_OK = 0,
  OSCARKV_E_CANCELLED = 1,
  OSCARKV_E_UNKNOWN = 2,
  OSCARKV_E_INVALID_ARGUMENT = 3,
  OSCARKV_E_DEADLINE_EXCEEDED = 4,
  OSCARKV_E_NOT_FOUND = 5,
  OSCARKV_E_ALREADY_EXISTS = 6,
  OSCARKV_E_PERMISSION_DENIED = 7,
  OSCARKV_E_RESOURCE_EXHAUSTED = 8,
  OSCARKV_E_FAILED_PRECONDITION = 9,
  OSCARKV_E_ABORTED = 10,
  OSCARKV_E_OUT_OF_RANGE = 11,
  OSCARKV_E_UNIMPLEMENTED = 12,
  OSCARKV_E_INTERNAL = 13,
  OSCARKV_E_UNAVAILABLE = 14,
  OSCARKV_E_DATA_LOSS = 15
};

enum { OSCARKV_PAGE_INT2 = 1, OSCARKV_PAGE_BF16 = 2 };
enum { OSCARKV_PATH_AUTO = 0, OSCARKV_PATH_SHM = 1, OSCARKV_PATH_GRPC = 2 };
/* Where lookups and releases go: AUTO = the daemon's local control socket when it is on this
 * host (else gRPC), LOCAL = that socket or fail oscarkv_connect, GRPC = always gRPC. */
enum { OSCARKV_LOOKUP_AUTO = 0, OSCARKV_LOOKUP_LOCAL = 1, OSCARKV_LOOKUP_GRPC = 2 };

/* Bumped when a signature or struct of this header changes (oscarkv_abi_version()). */
#define OSCARKV_ABI_VERSION 4

typedef struct oscarkv_client oscarkv_client;

typedef struct {
  const char* address;      /* "HOST:PORT" or "unix:/path"; NULL = "127.0.0.1:50051" */
  const char* client_name;  /* NULL = "oscarkv-c" */
  int data_path;            /* OSCARKV_PATH_* */
  int verify_checksums;     /* nonzero: verify every loaded page's checksum */
  int64_t rpc_timeout_ms;   /* <= 0: 10000 */
  int lookup_path;          /* OSCARKV_LOOKUP_* */
} oscarkv_connect_options;

/* Fills `opts` with the defaults above (verify_checksums = 1). */
void oscarkv_connect_options_init(oscarkv_connect_options* opts);

/* gRPC over TLS and the tenant's shared namespace, for oscarkv_connect_tls() (ABI 3; ABI 4 added
 * shared_namespace). struct_size must be sizeof(oscarkv_tls_options) of the header the caller
 * was built with (oscarkv_tls_options_init sets it); the ABI 3 size (without shared_namespace)
 * is still accepted, any other size this library does not know is INVALID_ARGUMENT, never a
 * guess. Paths are PEM files, read at connect (a file that goes missing later fails handshakes;
 * never plaintext). */
typedef struct {
  size_t struct_size;
  const char* ca_file;     /* CA bundle the daemon's certificate must chain to; NULL/"" = plaintext */
  const char* cert_file;   /* client certificate chain (a daemon with --tls-client-ca needs one) */
  const char* key_file;    /* its private key; with cert_file, both or neither */
  const char* server_name; /* name checked against the daemon's certificate; NULL/"" = the
                              address's host */
  const char* shared_namespace; /* ABI 4. A shared namespace of the daemon's config
                              (shared_namespaces:) that this client's tenant is a member of:
                              its stores and lookups use that namespace's keys, which every
                              member tenant sees. NULL/"" = the tenant's own. A non-member or an
                              unknown name: PERMISSION_DENIED at connect. Lookups then go over
                              gRPC (lookup_path LOCAL is INVALID_ARGUMENT). */
} oscarkv_tls_options;

/* Zeroes `tls` and sets struct_size. */
void oscarkv_tls_options_init(oscarkv_tls_options* tls);

/* Codec profile (docs/FORMAT.md §2). Strings are NUL-terminated UTF-8. */
typedef struct {
  const char* model_id;
  const char* model_revision;
  uint32_t num_layers, num_kv_heads, tp_rank, tp_size, head_dim, page_tokens, group_size,
      scale_dtype, sink_tokens, recent_tokens;
  uint8_t rotation_digest[32]; /* all zero: no rotation artifact */
} oscarkv_codec_profile;

/* A registered codec. Pass it back to the calls below. */
typedef struct {
  uint8_t codec_id[16];
  uint32_t page_tokens;
  uint64_t int2_page_bytes;
  uint64_t bf16_page_bytes;
} oscarkv_codec;

typedef struct {
  const uint8_t* key; /* 16 bytes */
  int kind;           /* OSCARKV_PAGE_* */
  const void* data;
  size_t bytes;
} oscarkv_page;

typedef struct {
  uint32_t stored, deduplicated, failed;
  int first_error;  /* code of the first failed page, OSCARKV_OK if none */
} oscarkv_store_result;

typedef struct {
  uint64_t pool_bytes, pool_used_bytes, pages, pinned_pages, leases, lookups, hits, misses,
      evictions;
} oscarkv_stats;

/* Message of the last error on this thread ("" after a success). */
const char* oscarkv_last_error(void);
/* "OK", "NOT_FOUND", ... for an OSCARKV_E_* code; "UNKNOWN_CODE" for anything else. */
const char* oscarkv_status_name(int code);
/* OSCARKV_ABI_VERSION of the library actually loaded (check it against the header's). */
int oscarkv_abi_version(void);

int oscarkv_connect(const oscarkv_connect_options* opts, oscarkv_client** out);
/* oscarkv_connect() over TLS (`tls` NULL = plaintext, as oscarkv_connect). A daemon that refuses
 * the certificate (none, another CA's, expired) or a daemon certificate that does not chain to
 * ca_file: UNAVAILABLE; an unreadable or non-PEM file: NOT_FOUND / INVALID_ARGUMENT. */
int oscarkv_connect_tls(const oscarkv_connect_options* opts, const oscarkv_tls_options* tls,
                        oscarkv_client** out);
void oscarkv_close(oscarkv_client* client); /* NULL is fine */
/* 1 when this client uses the shared-memory data path, 0 when gRPC streaming. */
int oscarkv_uses_shm(const oscarkv_client* client);
/* 1 when this client's lookups and releases use the daemon's local socket, 0 when gRPC. */
int oscarkv_uses_local_lookups(const oscarkv_client* client);

int oscarkv_register_codec(oscarkv_client* client, const oscarkv_codec_profile* profile,
                           oscarkv_codec* out);
/* Built-in shapes: "qwen3-8b", "refmodel". Registers that profile. */
int oscarkv_register_builtin_codec(oscarkv_client* client, const char* shape, oscarkv_codec* out);
/* Removes this tenant's registration of codec->codec_id from the daemon (an admin's: every
 * namespace's), freeing its codec slot and quota (UnregisterCodec in proto/oscarkv/v1/oscarkv.proto).
 * drop_pages 0: FAILED_PRECONDITION while the codec holds pages or transfer handles; nonzero:
 * those are deleted first. NOT_FOUND when the tenant has no registration of it (also a second
 * call). *pages_removed (may be NULL) receives the pages deleted. Afterwards this handle no
 * longer knows the codec (calls with it: NOT_FOUND until registered again). */
int oscarkv_unregister_codec(oscarkv_client* client, const oscarkv_codec* codec, int drop_pages,
                             uint64_t* pages_removed);

/* No daemon. Fills `out` with a built-in shape ("qwen3-8b", "refmodel"); its strings point to
 * storage owned by the library that lives as long as the process. */
int oscarkv_builtin_profile(const char* shape, oscarkv_codec_profile* out);
/* No daemon. Validates `profile` and writes its codec id (docs/FORMAT.md §2). */
int oscarkv_codec_id(const oscarkv_codec_profile* profile, uint8_t id_out[16]);
/* No daemon. Bytes of one page of `kind` (header included) under `profile`. */
int oscarkv_page_size(const oscarkv_codec_profile* profile, int kind, uint64_t* bytes);

/* Canonical block keys of every full block of `tokens` (no daemon needed). Writes
 * min(n_tokens / page_tokens, max_keys) keys of 16 bytes to keys_out and the number of full
 * blocks to *num_keys. */
int oscarkv_block_keys(const oscarkv_codec* codec, const char* tenant_salt, size_t salt_len,
                       const uint32_t* tokens, size_t n_tokens, uint8_t* keys_out,
                       size_t max_keys, size_t* num_keys);

/* ---- Rotation sets and the page builder (no daemon) ---- */

/* The rotations and clip ratios of an INT2 OSCAR codec (what `oscarkv calibrate` writes as
 * rotations.safetensors). Immutable; usable from many threads. */
typedef struct oscarkv_rotation oscarkv_rotation;

/* Copies matrices f32 [layers][2][kv_heads][head_dim][head_dim] (row-major, rows rotate as
 * x' = x * R; every matrix must be orthogonal within 1e-3), clips f32 [layers][2][kv_heads]
 * (in (0, 1]; 1 = no clip) and, optionally, range_modes u8 [layers][2][kv_heads] (0, 1, 3 or
 * 16..23 of docs/FORMAT.md §1.3.1; NULL = all 0). */
int oscarkv_rotation_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                            const float* matrices, const float* clips,
                            const uint8_t* range_modes, oscarkv_rotation** out);
void oscarkv_rotation_free(oscarkv_rotation* rotation); /* NULL is fine */
/* The rotation digest (FORMAT.md §2) that goes into oscarkv_codec_profile.rotation_digest. */
int oscarkv_rotation_digest(const oscarkv_rotation* rotation, uint8_t digest_out[32]);

enum { OSCARKV_DTYPE_F32 = 1, OSCARKV_DTYPE_BF16 = 2 };

/* Encodes one page (header, payload and checksum; docs/FORMAT.md §1) from K/V rows of
 * `token_count` tokens (1..page_tokens; slots past it are zero), laid out
 * [num_layers][2 (K, V)][token_count][num_kv_heads][head_dim] as f32 or bf16 (`dtype`).
 * rotation NULL: the rows are already rotated (or the profile has no artifact) and INT2 rows
 * are not clipped. rotation given: rows are rotated and clipped by it; its digest must equal
 * profile->rotation_digest. `out` must be exactly oscarkv_page_size(profile, kind) bytes. */
int oscarkv_build_page(const oscarkv_codec_profile* profile, const oscarkv_rotation* rotation,
                       int kind, int dtype, const void* rows, uint32_t token_count, void* out,
                       size_t out_bytes);
/* Checks a page against `profile` (header, shape, codec id, checksum: DATA_LOSS on mismatch)
 * and dequantizes it into rows_out, f32 [num_layers][2][token_count][num_kv_heads][head_dim]
 * in the rotated space; rows_capacity counts floats. *token_count and *kind (optional) receive
 * the page's. */
int oscarkv_decode_page(const oscarkv_codec_profile* profile, const void* page,
                        size_t page_bytes, float* rows_out, size_t rows_capacity,
                        uint32_t* token_count, int* kind);

/* ---- Daemon calls ---- */

/* Longest cached prefix of `keys` (n_keys x 16 bytes), without pinning. */
int oscarkv_lookup(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, uint32_t* matched);

/* Per-key existence (not a prefix): present[i] = 1 when keys[i] is cached, else 0. Nothing is
 * pinned; the answer can be stale the moment it returns (eviction). One unpinned lookup per
 * key, all in flight at once. */
int oscarkv_exists(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, uint8_t* present);

/* A lease on the pages of a pinned lookup: they are not evicted or deleted until it is
 * released or its deadline passes. */
typedef struct oscarkv_lease oscarkv_lease;
/* Longest cached prefix of `keys`, pinned for lease_ms (0 = the daemon's default, capped by
 * it). *lease_out receives a lease (also when *matched is 0) that the caller must hand to
 * oscarkv_release(). */
int oscarkv_lookup_pinned(oscarkv_client* client, const oscarkv_codec* codec,
                          const uint8_t* keys, size_t n_keys, uint32_t lease_ms,
                          uint32_t* matched, oscarkv_lease** lease_out);
/* Deadline of the lease (unix ms; 0 when nothing was pinned). */
uint64_t oscarkv_lease_deadline_ms(const oscarkv_lease* lease);
/* Releases the lease's pins (idempotent on the daemon) and frees `lease` in every case. NULL is
 * fine. */
int oscarkv_release(oscarkv_client* client, oscarkv_lease* lease);

/* Reserve + write + commit. Already-cached keys are skipped (counted as deduplicated). Returns
 * OSCARKV_OK only when every page was stored or deduplicated; otherwise the code of the first
 * page that failed (its index and the failure count in oscarkv_last_error()), or the code of
 * the whole call when it failed before any page was decided (then result->failed = n_pages).
 * `result` is filled either way. page_codes (optional, n_pages entries) receives each page's
 * code: OSCARKV_OK (stored), OSCARKV_E_ALREADY_EXISTS (deduplicated) or its error. */
int oscarkv_store(oscarkv_client* client, const oscarkv_codec* codec, const oscarkv_page* pages,
                  size_t n_pages, oscarkv_store_result* result, int* page_codes);

/* Deletes cached pages. key_codes (optional, n_keys entries) receives per key OSCARKV_OK
 * (deleted), OSCARKV_E_NOT_FOUND (was not cached) or OSCARKV_E_FAILED_PRECONDITION (pinned by
 * a lease: removed from the index now, its memory freed when the lease ends); *deleted
 * (optional) the number removed (OK or FAILED_PRECONDITION). Returns OSCARKV_OK when every key
 * is removed or absent, else the first other code. */
int oscarkv_delete(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, int* key_codes, uint32_t* deleted);

/* Loads the longest cached prefix of `keys` into dst[i] (capacity dst_bytes[i]); *matched
 * receives the number of pages loaded, page_bytes[i] (optional, may be NULL) their sizes. */
int oscarkv_load(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                 size_t n_keys, void* const* dst, const size_t* dst_bytes, uint32_t* matched,
                 uint64_t* page_bytes);

/* Asynchronous load: returns at once; `done(user, code, matched)` runs on a library thread.
 * On code != OSCARKV_OK the message is in oscarkv_last_error() inside the callback. */
typedef void (*oscarkv_load_done)(void* user, int code, uint32_t matched);
int oscarkv_load_async(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                       size_t n_keys, void* const* dst, const size_t* dst_bytes,
                       oscarkv_load_done done, void* user);

int oscarkv_stats_get(oscarkv_client* client, oscarkv_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* OSCARKV_CLIENT_OSCARKV_C_H_ */
