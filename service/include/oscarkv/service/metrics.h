// Prometheus metrics of the daemon: per-RPC latency histograms and result codes, plus the
// PageCache counters and gauges, rendered in the text exposition format (version 0.0.4).
// Recording is lock-free (atomics); Render may run concurrently with recording.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "oscarkv/service/page_cache.h"

namespace oscarkv::service {

enum class Rpc {
  kHandshake,
  kRegisterCodec,
  kLookup,
  kReserve,
  kCommit,
  kAbort,
  kWritePages,
  kReadPages,
  kRelease,
  kRenewLease,
  kDelete,
  kClear,
  kStats,
  kPublishHandle,
  kOpenHandle,
  kCloseHandle,
  kGetDataPlane,
  kStageForRma,
  kUnregisterCodec,
  // Methods only the same-host control socket carries (proto/oscarkv/v1/local_control.h).
  kAttachStaging,
  kStageWrite,
  kAttachLoadStaging,
  kStageRead,
  kCount
};
// Every method the same-host control socket carries, in /metrics order.
inline constexpr Rpc kLocalMethods[] = {Rpc::kHandshake,     Rpc::kLookup,     Rpc::kRelease,
                                        Rpc::kReserve,       Rpc::kAttachStaging,
                                        Rpc::kStageWrite,    Rpc::kAttachLoadStaging,
                                        Rpc::kStageRead};
const char* RpcName(Rpc rpc);

class Histogram {
 public:
  // Upper bounds in seconds.
  static constexpr std::array<double, 16> kBounds = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
      10e-3, 25e-3, 50e-3,  100e-3, 250e-3, 1.0,  2.5,    10.0};
  void Observe(int64_t nanos);
  void Render(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanos_{0};
};

class Metrics {
 public:
  void Record(Rpc rpc, int grpc_code, int64_t nanos);
  const Histogram& latency(Rpc rpc) const { return latency_[static_cast<int>(rpc)]; }
  // The same-host control socket: calls it carried (each also timed and counted by Record, as
  // every gRPC call is), open connections, and frames refused as malformed.
  void RecordLocalCall(Rpc rpc) {
    local_calls_[static_cast<int>(rpc)].fetch_add(1, std::memory_order_relaxed);
  }
  void LocalConnection(int delta) { local_connections_.fetch_add(delta, std::memory_order_relaxed); }
  void LocalMalformed() { local_malformed_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t local_calls(Rpc rpc) const {
    return local_calls_[static_cast<int>(rpc)].load(std::memory_order_relaxed);
  }
  int64_t local_connections() const { return local_connections_.load(std::memory_order_relaxed); }
  uint64_t local_malformed() const { return local_malformed_.load(std::memory_order_relaxed); }
  uint64_t calls(Rpc rpc, int code) const;
  // Text exposition of everything, including the cache's counters and gauges.
  std::string Render(const PageCache& cache) const;

 private:
  static constexpr int kCodes = 17;
  std::array<Histogram, static_cast<int>(Rpc::kCount)> latency_;
  std::array<std::array<std::atomic<uint64_t>, kCodes>, static_cast<int>(Rpc::kCount)> codes_{};
  std::array<std::atomic<uint64_t>, static_cast<int>(Rpc::kCount)> local_calls_{};
  std::atomic<int64_t> local_connections_{0};
  std::atomic<uint64_t> local_malformed_{0};
};

}  // namespace oscarkv::service
