// Internal to `oscarkv bench transfer` (bench/transfer_bench.h): the peer process, the
// ucx_perftest runs, one transport's measurements.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/util/args.h"

namespace oscarkv::bench::transfer_bench {

inline std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Page-aligned, zeroed host memory.
struct HostBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit HostBuffer(size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) == 0) {
      data = static_cast<uint8_t*>(p);
      std::memset(data, 0, n);
    }
  }
  ~HostBuffer() { std::free(data); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
};

// Pages in `count` slots of `bytes` whose header and checksum verify; the first failures are
// described in `first_bad` (when given).
size_t CountValid(const uint8_t* pool, size_t bytes, size_t count, std::string* first_bad = nullptr);

// The 1-minute load average: benchmarks on a shared machine are only as good as its quiet.
std::string LoadAverage();

// UCX confined to loopback (and shared memory): UCX_TLS `tls`, UCX_NET_DEVICES=lo.
transport::ContextOptions LoopbackContext(const std::string& tls);

// The peer (`bench transfer --serve`): holds registered pools of real pages, sends its worker
// address and both pools' keys over --control-fd, serves RMA until the socket closes.
int Serve(const Args& args);

struct PerftestResult {
  double gbps = 0;  // 1e9 bytes/s
  std::string command;
};

// ucx_perftest server + client on 127.0.0.1, same UCX_TLS; "Final:" line -> overall MB/s.
absl::StatusOr<PerftestResult> RunPerftest(const std::string& perftest, const std::string& tls,
                                           const std::string& test, size_t msg_bytes,
                                           int64_t iters, int port, int outstanding);

struct TransportReport {
  std::string name, tls, lanes, error_handling;
  double get_gbps = 0, put_gbps = 0;    // distinct pages (real batch)
  double get1_gbps = 0, put1_gbps = 0;  // one reused page buffer per end (perftest's pattern)
  double perftest_get_gbps = 0, perftest_put_gbps = 0, memcpy_gbps = 0, memcpy1_gbps = 0;
  std::string perftest_get_cmd, perftest_put_cmd;
  double batch_get_ms = 0;
  uint64_t int2_handoff_bytes = 0, bf16_handoff_bytes = 0;
  double int2_handoff_s = 0, bf16_handoff_s = 0;
  size_t int2_handoff_pages = 0, int2_handoff_bf16_pages = 0;
  size_t verified_pages = 0, checked_pages = 0;
};

struct BenchConfig {
  std::string perftest;
  int64_t batch_pages, bw_pages, reps, handoff_tokens, bf16_distinct, perftest_outstanding;
  int port;
};

// One transport: spawns the peer, measures page-batch get/put and memcpy beside ucx_perftest
// (best of cfg.reps, interleaved), then the handoff INT2 page set vs all-BF16, and verifies
// every page that crossed, at both ends.
absl::StatusOr<TransportReport> BenchOne(const std::string& name, const BenchConfig& cfg,
                                         const CodecProfile& profile);

}  // namespace oscarkv::bench::transfer_bench
