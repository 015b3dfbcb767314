// Stores and verified loads of a batch of pages through the client library, each beside a plain
// memcpy of the same bytes in the same run (`oscarkv bench service`: store_vs_memcpy,
// load_verified_vs_memcpy).
//
// What is timed, and how the two sides are kept equal:
// * store: one Client::Store of the batch (Reserve, the copy of every page into its pool slot
//   hashed in the same pass, Commit) -- every RPC included. Between iterations the batch is
//   deleted again (untimed), so each timed store writes all of its pages.
// * verified load: one Client::LoadInto of the batch into caller buffers (pin, the copy out of
//   the pool hashed in the same pass and checked against each page's checksum, release).
// * memcpy: the same byte count (every page, whole) from one buffer to another, both allocated
//   for this measurement -- neither is the pool nor the store's source -- timed beside each
//   side. Its source holds the same page bytes.
// * First touch: every buffer either side writes (pool slots, load buffers, the memcpy's
//   destination) is written once in an untimed warm-up round, so neither side's timing counts
//   page faults; neither is cache-warm either beyond what the other side's round left (the
//   sides alternate, and which runs first alternates every iteration).
// Each side's GB/s is its bytes over its own total time; a ratio is path GB/s / memcpy GB/s.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/testing/local_daemon.h"

namespace oscarkv::bench {

struct StoreLoadVsMemcpy {
  int iterations = 0;
  uint64_t batch_bytes = 0;
  double store_gbps = 0, store_memcpy_gbps = 0;  // store, and the memcpy timed beside it
  double load_gbps = 0, load_memcpy_gbps = 0;    // verified load, and its memcpy
  double store_ms_p50 = 0, load_ms_p50 = 0, memcpy_ms_p50 = 0;  // per batch
  double store_vs_memcpy() const { return store_gbps / store_memcpy_gbps; }
  double load_verified_vs_memcpy() const { return load_gbps / load_memcpy_gbps; }
};

// `c` should be connected with the client library's defaults (the shared-memory data path,
// checksums verified: what the figures claim). `keys` must not be stored; they are deleted
// again at the end. Runs at least 5 iterations and at least `duration_s`. Every loaded page is
// compared with `pages` after the timed loop (INTERNAL if one differs).
absl::StatusOr<StoreLoadVsMemcpy> MeasureStoreLoadVsMemcpy(
    client::Client& c, const client::Codec& codec, std::span<const BlockKey> keys,
    std::span<const std::vector<uint8_t>> pages, double duration_s);

// The same measurement against a daemon of its own: `daemon` started with `--shm-mode
// shm_mode` added (isolated: the pool is read-only to clients and stores go through staging the
// daemon hashes; trusted: clients write the pool), a client connected with the library's
// defaults, `profile` registered. Run beside the default daemon's figures, it says what
// isolation costs. `connect` (its address is filled in) adds what the client needs beyond the
// defaults: a tenant's certificate (the daemon's flags then name its --config); such a client
// must be on shared memory (FAILED_PRECONDITION otherwise: the figures would be gRPC's).
absl::StatusOr<StoreLoadVsMemcpy> MeasureStoreLoadOnOwnDaemon(
    testing::LocalDaemonOptions daemon, const std::string& shm_mode, const CodecProfile& profile,
    std::span<const BlockKey> keys, std::span<const std::vector<uint8_t>> pages,
    double duration_s, client::ConnectOptions connect = {});

}  // namespace oscarkv::bench
