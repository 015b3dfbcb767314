// The daemon's UCX data plane: one ucp context and worker, the pool arena registered once, and a
// progress thread that sleeps on the worker's event fd when idle (tcp RMA is emulated with
// active messages, so the target side must progress). Clients learn the worker address and the
// pool's exported rkey through the GetDataPlane RPC and then read leased pages with RMA gets;
// the daemon never initiates transfers, so a client that dies costs it nothing but UCX's own
// endpoint cleanup.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service {

class UcxDataPlane {
 public:
  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Start(const std::string& tls,
                                                             const std::string& net_devices,
                                                             uint8_t* pool_base,
                                                             size_t pool_bytes);
  ~UcxDataPlane();  // stops the progress thread, then releases worker, region, context
  UcxDataPlane(const UcxDataPlane&) = delete;
  UcxDataPlane& operator=(const UcxDataPlane&) = delete;

  // Immutable after Start: safe from any thread.
  const ::oscarkv::v1::GetDataPlaneResponse& info() const { return info_; }

 private:
  UcxDataPlane() = default;
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<transport::Worker> worker_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  ::oscarkv::v1::GetDataPlaneResponse info_;
};

}  // namespace oscarkv::service
