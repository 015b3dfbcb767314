// oscarkv client: the library an inference engine links to store and fetch OSCAR-compressed KV
// pages in its node's cache daemon (oscarkvd).
//
// Contract
// * Creation: Client::Connect() dials the daemon, performs the Handshake (wire version check) and,
//   when the daemon's shared-memory pool segment is readable on this host, maps it read-write.
//   The returned Client owns the gRPC channel, the mapping and a small worker pool for the *Async
//   calls; destroying it waits for queued async work, then unmaps. Leases it still holds expire
//   on the daemon by themselves (a dead client never loses the cache, only its leases).
// * Thread-safety: every method may be called concurrently from any number of threads on one
//   Client. No lock is held across an RPC.
// * Data paths: kSharedMemory writes page bytes straight into reserved pool slots and copies
//   leased pages straight out of the pool; kGrpc streams them (WritePages / ReadPages). kAuto
//   picks shared memory when the segment could be mapped, else gRPC. Results are identical.
//   On an isolated daemon (the default) stores go through a staging region the daemon copies
//   from; an admin maps the pool read-only, a tenant never maps it and loads through a region
//   of its own connection that the daemon fills only with pages that tenant may read. Both are
//   kSharedMemory; handle loads of a tenant stream over gRPC.
// * Integrity, one pass per side: every copy the library makes of a page (into a pool slot, out
//   of the pool, out of a gRPC stream) hashes it in the same pass, in cache-sized chunks, and
//   compares with the page's XXH3 checksum. A store over shared memory commits only pages whose
//   slot bytes matched (the daemon then checks headers without reading the bytes again); the
//   daemon verifies streamed pages itself. A page corrupted anywhere between the writer and the
//   reader is DATA_LOSS at load, never returned (with verify_checksums, the default).
// * Control path of Lookup and Release (the calls an engine makes per request): kLocal sends
//   them over the daemon's same-host control socket (HandshakeResponse.local_socket; small
//   frames on a unix-domain socket, answered inline by the daemon's epoll thread -- a fraction
//   of gRPC's CPU per call), kGrpc over gRPC. kAuto (the default) uses the local socket when the
//   daemon announces one and this process can connect to it (which proves it is on this host),
//   else gRPC. Same messages, same validation, same leases and result codes either way; every
//   other call always goes over gRPC. A lookup of more keys than fit a local frame
//   (v1::local::kMaxLookupKeys, 6080; only possible with a daemon max_batch above that) goes
//   over gRPC.
// * Pages are the byte format of docs/FORMAT.md §1 and are opaque to this API except for the
//   checks named below. Keys are the canonical chained block keys of §3 (BlockKeys()).
// * Errors: absl::Status; codes are the daemon's gRPC codes passed through one-to-one
//   (UNAVAILABLE when the daemon is down, NOT_FOUND for an unregistered codec, ...), plus
//   INVALID_ARGUMENT for inputs the client rejects before sending and DATA_LOSS for a page whose
//   checksum does not verify on Load.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/kernels/block_key.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::client {

enum class DataPath { kAuto, kSharedMemory, kGrpc };
const char* DataPathName(DataPath path);
// How Lookup, LookupAsync and Release reach the daemon (see the contract above).
enum class LookupPath { kAuto, kLocal, kGrpc };
const char* LookupPathName(LookupPath path);  // "auto", "local", "grpc"

struct ConnectOptions {
  // "HOST:PORT" or "unix:/path".
  std::string address = "127.0.0.1:50051";
  std::string client_name = "oscarkv-client";
  // kSharedMemory fails Connect when the segment cannot be mapped; kGrpc never maps it.
  DataPath data_path = DataPath::kAuto;
  // kLocal fails Connect when the daemon's local control socket cannot be used; kGrpc never
  // tries it.
  LookupPath lookup_path = LookupPath::kAuto;
  // Verify every loaded page's header (codec id, shape) and XXH3 checksum. Header checks are
  // always done; this switches the checksum over the whole page.
  bool verify_checksums = true;
  // Deadline of each RPC (a streaming call of a batch counts as one RPC), and of Connect.
  int64_t rpc_timeout_ms = 10000;
  // Store: how long to keep asking for a key that another reservation holds uncommitted (the
  // daemon's ABORTED, "in progress") before reporting it as not stored (at most rpc_timeout_ms;
  // 0 = ask once). When the other store commits meanwhile, the key counts as deduplicated.
  int64_t store_in_progress_wait_ms = 2000;
  // Threads running the *Async calls (at least 1).
  int async_threads = 2;
  // Bytes per WriteChunk / expected ReadChunk on the gRPC data path.
  uint32_t stream_chunk_bytes = 1 << 20;
  // false: Clients of one process dialing the same address share one HTTP/2 connection (gRPC
  // multiplexes their calls; far cheaper per call) and one local-socket channel (its pool of
  // blocking connections and its pipelined LookupAsync connection). Over TLS they share it too
  // when their CA, certificate and key files hold the same bytes (one handshake, not one per
  // Client). true: this Client opens its own.
  bool dedicated_connection = false;
  // gRPC over TLS (a daemon started with --tls-cert): the CA bundle (PEM file) the daemon's
  // certificate must chain to; "" = plaintext. With tls_cert_file and tls_key_file (PEM) the
  // client presents that certificate (a daemon with --tls-client-ca requires one).
  // tls_server_name: the name checked against the daemon's certificate ("" = the address's host).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // A daemon with tenants (service/README.md "Tenants"): "" = this client's own tenant's
  // namespace; else a shared namespace the daemon's config lets this client's tenant use
  // (shared_namespaces:), whose pages every member tenant may store and look up. Connect fails
  // with PERMISSION_DENIED when the tenant is no member. Sent with every gRPC call; lookups of
  // such a client go over gRPC (the local socket serves own namespaces only).
  std::string shared_namespace;
};

// What the daemon said in the handshake.
struct ServerInfo {
  std::string server_version;
  std::string node_id;
  std::string shm_path;  // empty when the daemon has no shared-memory segment
  uint64_t shm_bytes = 0;
  uint32_t max_batch = 0;
  DataPath data_path = DataPath::kGrpc;  // the path this client actually uses
  std::string local_socket;  // the daemon's same-host control socket; empty when it has none
  LookupPath lookup_path = LookupPath::kGrpc;  // the path this client's lookups actually use
};

// A registered codec: its id and the exact page sizes the daemon expects.
struct Codec {
  CodecId id;
  CodecProfile profile;
  uint64_t int2_page_bytes = 0;
  uint64_t bf16_page_bytes = 0;
  uint64_t page_bytes(PageKind kind) const {
    return kind == PageKind::kInt2 ? int2_page_bytes : bf16_page_bytes;
  }
};

// One page of a daemon's pool (a lease's view of it).
struct PageRef {
  BlockKey key;
  uint64_t offset = 0;  // inside the shared-memory segment
  uint64_t bytes = 0;
  PageKind kind = PageKind::kInt2;
  uint32_t token_count = 0;
};

struct LookupOptions {
  // Pin the matched pages under a lease (release it with Release()). false = a pure probe.
  bool pin = false;
  uint32_t lease_ms = 0;  // 0 = the daemon's default
};

struct LookupResult {
  uint32_t matched = 0;              // longest cached prefix of the keys
  std::vector<uint64_t> lease_ids;   // one per max_batch chunk pinned; empty when not pinned
  uint64_t lease_deadline_unix_ms = 0;
  std::vector<PageRef> pages;        // the first `matched` pages, when pinned
};

// A page to store: its key, its kind and its bytes (borrowed for the duration of the call).
struct PageWrite {
  BlockKey key;
  PageKind kind = PageKind::kInt2;
  std::span<const uint8_t> bytes;
};

// What Store did with each page. A page is cached only when its item_status is OK (committed
// by this call) or ALREADY_EXISTS (committed before: deduplicated); every other status says why
// it is NOT cached, e.g. DATA_LOSS (its bytes do not match its checksum), ABORTED (another
// reservation still holds the key uncommitted after store_in_progress_wait_ms: store it again
// later), RESOURCE_EXHAUSTED (no room), INVALID_ARGUMENT (rejected before sending).
struct StoreResult {
  uint32_t stored = 0;        // newly committed
  uint32_t deduplicated = 0;  // already committed before this call: skipped
  uint32_t failed = 0;        // not cached: see item_status
  std::vector<absl::Status> item_status;  // per input page: OK, ALREADY_EXISTS, or the error
  // OK when every page is cached (stored or deduplicated); else the code of the first page that
  // is not, with how many are not and that page's index and reason.
  absl::Status ToStatus() const;
};

struct LoadResult {
  uint32_t matched = 0;  // pages loaded: the longest cached prefix of the keys
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageKind> kinds;
  uint64_t bytes = 0;
  // Why releasing the lease after the copy failed (OK when it did not). The pages are verified
  // and valid either way, and the lease then runs to its deadline; but an error here (e.g.
  // DEADLINE_EXCEEDED) says the daemon stopped answering after it served them, which a caller
  // that routes around failed daemons (ClusterClient) must learn.
  absl::Status release_status;
};

struct Stats {
  uint64_t pool_bytes = 0, pool_used_bytes = 0, pages = 0, pinned_pages = 0, leases = 0,
           reservations = 0, lookups = 0, hits = 0, misses = 0, evictions = 0, bytes_written = 0,
           bytes_read = 0;
  uint32_t codecs = 0;
  std::string node_id, server_version;
};

class Client {
 public:
  // Dials, handshakes and maps the pool segment (see the contract above). UNAVAILABLE or
  // DEADLINE_EXCEEDED when no daemon answers within rpc_timeout_ms.
  //
  // A daemon restarted behind the same address (a new instance) is reconnected to by the next
  // Store, Load, LoadInto or Lookup: the Client handshakes again and re-attaches the local
  // socket, the pool mapping and its staging regions (a lookup that meets the restart is sent
  // once more to the new instance). Leases and reservations of the old instance are gone with
  // it, and its codec registrations too unless it keeps a tier: register again. A call that
  // finds no daemon yet fails as before; the next one tries again.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  virtual ~Client() = default;

  // What the last handshake (Connect or a reconnect) said: a copy, safe to take while another
  // thread's call reconnects.
  virtual ServerInfo server() const = 0;
  virtual const ConnectOptions& options() const = 0;

  // Registers (idempotently) a codec profile with the daemon; pages and keys of other codecs
  // are never mixed with this one's.
  virtual absl::StatusOr<Codec> RegisterCodec(const CodecProfile& profile) = 0;

  // Canonical chained keys of every full page_tokens block of `tokens` (FORMAT.md §3).
  static std::vector<BlockKey> BlockKeys(const Codec& codec, std::span<const uint32_t> tokens,
                                         std::string_view tenant_salt = "");

  // The longest cached prefix of `keys` (a chained prefix, in order). Batches above the
  // daemon's max_batch are split; a chunk is only asked when the previous one fully matched.
  virtual absl::StatusOr<LookupResult> Lookup(const Codec& codec,
                                              std::span<const BlockKey> keys,
                                              const LookupOptions& options = {}) = 0;
  // Releases every lease of a pinned lookup (idempotent; unknown leases are OK).
  virtual absl::Status Release(const LookupResult& lookup) = 0;
  virtual absl::Status Release(uint64_t lease_id) = 0;
  // Extends a lease to `lease_ms` from now (capped by the daemon); returns the new deadline
  // (unix ms). NOT_FOUND when the lease is unknown or already expired.
  virtual absl::StatusOr<uint64_t> RenewLease(uint64_t lease_id, uint32_t lease_ms) = 0;

  // Reserve + write + commit. Keys already cached are skipped (deduplicated). Each page is
  // checked before anything is sent: size must equal the codec's page size of its kind, and its
  // header must carry this codec's id and shape. Pages that fail are reported in item_status;
  // the call itself fails only when the daemon cannot be reached or rejects the whole batch.
  virtual absl::StatusOr<StoreResult> Store(const Codec& codec,
                                            std::span<const PageWrite> pages) = 0;

  // Lookup with a lease, copy the matched prefix out, verify it, release the lease. A page
  // whose bytes fail verification fails the call with DATA_LOSS and is deleted from the daemon
  // (best effort), so that the cache stops claiming it and a Store of it stores it again.
  virtual absl::StatusOr<LoadResult> Load(const Codec& codec, std::span<const BlockKey> keys) = 0;
  // The same into caller buffers: dst[i] receives page i and must be at least its size.
  // Returns the number of pages loaded (the matched prefix). `bytes_out`, if given, receives
  // each loaded page's size.
  virtual absl::StatusOr<uint32_t> LoadInto(const Codec& codec, std::span<const BlockKey> keys,
                                            std::span<const std::span<uint8_t>> dst,
                                            std::vector<uint64_t>* bytes_out = nullptr) = 0;

  // Operator calls.
  virtual absl::StatusOr<Stats> GetStats() = 0;
  // Per key: OK, NOT_FOUND, or FAILED_PRECONDITION (pinned; deleted when released).
  virtual absl::StatusOr<std::vector<absl::Status>> Delete(const Codec& codec,
                                                           std::span<const BlockKey> keys) = 0;
  // Drops cached pages of `codec_id` (nullptr: every codec). Returns pages removed.
  virtual absl::StatusOr<uint64_t> Clear(const CodecId* codec_id, bool include_pinned) = 0;
  // Clear, then (free_codecs) unregister the cleared codecs that hold nothing any more, as
  // UnregisterCodec does; *codecs_freed (if given) receives how many.
  virtual absl::StatusOr<uint64_t> Clear(const CodecId* codec_id, bool include_pinned,
                                         bool free_codecs, uint32_t* codecs_freed) = 0;
  // Removes this tenant's registration of `codec_id` from the daemon (an admin's call: every
  // namespace's), freeing its codec slot and quota; the proto's UnregisterCodec has the
  // contract. FAILED_PRECONDITION while it holds pages or handles unless `drop_pages` (then
  // they are deleted first); NOT_FOUND when not registered. Returns the pages removed.
  virtual absl::StatusOr<uint64_t> UnregisterCodec(const CodecId& codec_id, bool drop_pages) = 0;

  // Non-blocking lookup: returns at once, no thread waits for the answer. Over the local socket
  // it is pipelined on one connection and `done` runs on that connection's reader thread; over
  // gRPC it uses the callback API and `done` runs on a gRPC thread. Either way keep `done` short
  // and never block in it (a blocking call of this client from it is allowed). The keys are
  // copied before this returns. Above max_batch keys (or, locally, kMaxLookupKeys) it runs the
  // blocking Lookup on the worker pool. When the call cannot even be sent, `done` runs at once
  // on the calling thread with the error.
  virtual void LookupAsync(const Codec& codec, std::span<const BlockKey> keys,
                           const LookupOptions& options,
                           std::function<void(absl::StatusOr<LookupResult>)> done) = 0;
  std::future<absl::StatusOr<LookupResult>> LookupAsync(const Codec& codec,
                                                        std::span<const BlockKey> keys,
                                                        const LookupOptions& options = {});

  // Asynchronous variants on the client's worker pool. The spans' memory (keys, page bytes,
  // destination buffers) must stay valid until the future is ready / the callback ran.
  std::future<absl::StatusOr<StoreResult>> StoreAsync(const Codec& codec,
                                                      std::span<const PageWrite> pages);
  std::future<absl::StatusOr<LoadResult>> LoadAsync(const Codec& codec,
                                                    std::span<const BlockKey> keys);
  void LoadIntoAsync(const Codec& codec, std::span<const BlockKey> keys,
                     std::span<const std::span<uint8_t>> dst,
                     std::function<void(absl::StatusOr<uint32_t>)> done);
  void StoreAsync(const Codec& codec, std::span<const PageWrite> pages,
                  std::function<void(absl::StatusOr<StoreResult>)> done);

 protected:
  Client() = default;
  // Runs `task` on the worker pool.
  virtual void Submit(std::function<void()> task) = 0;
};

}  // namespace oscarkv::client
