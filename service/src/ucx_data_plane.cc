#include "ucx_data_plane.h"

#include "absl/time/time.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::service {

absl::StatusOr<std::unique_ptr<UcxDataPlane>> UcxDataPlane::Start(const std::string& tls,
                                                                  const std::string& net_devices,
                                                                  uint8_t* pool_base,
                                                                  size_t pool_bytes) {
  auto dp = std::unique_ptr<UcxDataPlane>(new UcxDataPlane);
  transport::ContextOptions co;
  co.tls = tls;
  co.net_devices = net_devices;
  co.name = "oscarkvd";
  OSCARKV_ASSIGN_OR_RETURN(dp->context_, transport::Context::Create(co));
  OSCARKV_ASSIGN_OR_RETURN(dp->region_, dp->context_->Register(pool_base, pool_bytes));
  OSCARKV_ASSIGN_OR_RETURN(dp->worker_, transport::Worker::Create(*dp->context_));
  auto& info = dp->info_;
  info.set_worker_address(dp->worker_->address());
  info.set_pool_rkey(dp->region_->exported());
  info.set_pool_base(reinterpret_cast<uint64_t>(pool_base));
  info.set_pool_bytes(pool_bytes);
  info.set_tls(tls);
  for (const std::string& t : dp->context_->capabilities().transports) info.add_transports(t);
  info.set_peer_failure_detection(dp->context_->capabilities().peer_failure_detection);
  // From here on the worker belongs to the progress thread.
  transport::Worker* w = dp->worker_.get();
  std::atomic<bool>* stop = &dp->stop_;
  dp->progress_ = std::thread([w, stop] {
    while (!stop->load(std::memory_order_acquire)) w->WaitForEvents(absl::Milliseconds(100));
  });
  return dp;
}

UcxDataPlane::~UcxDataPlane() {
  stop_.store(true, std::memory_order_release);
  if (progress_.joinable()) progress_.join();
  worker_.reset();
  region_.reset();
  context_.reset();
}

}  // namespace oscarkv::service
