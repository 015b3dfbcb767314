// Endpoint::Post and Transfer: a batch of RMA ops, its completion, watchdog and cancellation.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv::transport {

// Written by UCX completion callbacks through the ops' user_data pointers. Owned by the Transfer;
// deliberately leaked if a request never returns even after its endpoint was force-closed (a
// callback could otherwise write into freed memory).
struct Transfer::State {
  struct Op {
    State* state = nullptr;
    absl::Status status = absl::UnavailableError("not completed");
    bool done = false;
    UcpRequestPtr request;
  };
  Direction direction = Direction::kGet;
  std::vector<Op> ops;
  uint64_t bytes = 0;
  size_t outstanding = 0;  // posted requests whose callback has not run, plus a pending flush
  bool flush_posted = false;
  UcpRequestPtr flush_request;
  absl::Status flush_status;
  bool finished = false;
  absl::Status final_status;
  absl::Time last_progress;

  void OpDone(Op& op, ucs_status_t status) {
    --outstanding;
    if (finished) return;  // abandoned after the batch failed: its result stays "failed"
    ++outstanding;
    op.done = true;
    op.status = FromUcs(status, absl::StrCat("RMA ", DirectionName(direction)));
    --outstanding;
    last_progress = absl::Now();
  }
  static void OnOp(void* /*request*/, ucs_status_t status, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->state->OpDone(*op, status);
  }
  static void OnFlush(void* /*request*/, ucs_status_t status, void* user_data) {
    auto* st = static_cast<State*>(user_data);
    if (st->finished) {
      --st->outstanding;
      return;
    }
    st->flush_status = FromUcs(status, "flush after puts");
    --st->outstanding;
    st->last_progress = absl::Now();
  }
};

Transfer::Transfer(Endpoint* ep, Direction d, size_t n) : ep_(ep), state_(new State()) {
  state_->direction = d;
  state_->ops.resize(n);
  for (auto& op : state_->ops) op.state = state_.get();
  state_->last_progress = absl::Now();
}

size_t Transfer::size() const { return state_->ops.size(); }
const absl::Status& Transfer::op_status(size_t i) const { return state_->ops[i].status; }
uint64_t Transfer::bytes() const { return state_->bytes; }
size_t Transfer::num_ok() const {
  return std::count_if(state_->ops.begin(), state_->ops.end(),
                       [](const State::Op& op) { return op.done && op.status.ok(); });
}

absl::StatusOr<std::unique_ptr<Transfer>> Endpoint::Post(Direction direction,
                                                         const MemoryRegion& local,
                                                         const RemoteMemory& remote,
                                                         std::span<const TransferDesc> descs) {
  if (ep_ == nullptr || failed()) {
    return absl::UnavailableError(absl::StrCat("Post: endpoint failed: ", status_.message()));
  }
  if (descs.empty()) return absl::InvalidArgumentError("Post: empty batch");
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferDesc& d = descs[i];
    if (d.length == 0) return absl::InvalidArgumentError(absl::StrCat("Post: op ", i, " is empty"));
    if (!local.Contains(d.local, d.length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Post: op ", i, " local range is outside the registered region"));
    }
    if (!remote.Contains(d.remote, d.length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Post: op ", i, " remote range is outside the remote region"));
    }
  }
  std::unique_ptr<Transfer> t(new Transfer(this, direction, descs.size()));
  Transfer::State& st = *t->state_;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferDesc& d = descs[i];
    Transfer::State::Op& op = st.ops[i];
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    param.cb.send = &Transfer::State::OnOp;
    param.user_data = &op;
    param.memh = local.raw();
    ucs_status_ptr_t r =
        direction == Direction::kGet
            ? ucp_get_nbx(ep_, d.local, d.length, d.remote, remote.raw(), &param)
            : ucp_put_nbx(ep_, d.local, d.length, d.remote, remote.raw(), &param);
    st.bytes += d.length;
    if (r == nullptr) {
      op.done = true;
      op.status = absl::OkStatus();
    } else if (UCS_PTR_IS_ERR(r)) {
      op.done = true;
      op.status = FromUcs(UCS_PTR_STATUS(r), absl::StrCat("post RMA ", DirectionName(direction)));
      // Ops not posted stay "not completed"; the batch fails once the posted ones return.
      for (size_t j = i + 1; j < descs.size(); ++j) {
        st.ops[j].done = true;
        st.ops[j].status = absl::CancelledError("not posted: an earlier op of the batch failed");
      }
      break;
    } else {
      op.request.reset(r);
      ++st.outstanding;
    }
  }
  st.last_progress = absl::Now();
  t->Progressed();
  return t;
}

absl::Status Endpoint::Run(Direction direction, const MemoryRegion& local,
                           const RemoteMemory& remote, std::span<const TransferDesc> descs,
                           absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<Transfer>> t = Post(direction, local, remote, descs);
  if (!t.ok()) return t.status();
  return (*t)->Wait(timeout);
}

void Transfer::Progressed() {
  State& st = *state_;
  if (st.finished) return;
  // A failed endpoint or a silent peer: force-close so every request returns, then finish.
  if (st.outstanding > 0) {
    if (!ep_->failed() && absl::Now() - st.last_progress > ep_->options().peer_timeout) {
      ep_->Abort(absl::UnavailableError(absl::StrCat(
          "peer '", ep_->options().name, "' completed nothing for ",
          absl::FormatDuration(ep_->options().peer_timeout), " (", st.outstanding,
          " requests outstanding); declared gone")));
    }
    if (!ep_->failed()) return;
    // Force-close: with peer error handling UCX completes every request with an error. Without
    // it (ErrorHandling::kNone) requests to a dead peer may never return; they are abandoned
    // (their state is kept alive, see ~Transfer) and reported failed.
    ep_->Close(/*force=*/true);
    DrainAfterAbort();
    for (State::Op& op : st.ops) {
      if (!op.done) op.status = absl::UnavailableError("abandoned: the peer is gone");
    }
  }
  bool any_failed = false;
  for (const State::Op& op : st.ops) any_failed |= !op.status.ok();
  if (st.direction == Direction::kPut && !any_failed && !ep_->failed()) {
    if (!st.flush_posted) {
      // Local completion of a put only means its buffer may be reused; the batch is done when
      // the data is at the peer.
      st.flush_posted = true;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = &State::OnFlush;
      param.user_data = &st;
      ucs_status_ptr_t r = ucp_ep_flush_nbx(ep_->ep_, &param);
      if (r == nullptr) {
        st.flush_status = absl::OkStatus();
      } else if (UCS_PTR_IS_ERR(r)) {
        st.flush_status = FromUcs(UCS_PTR_STATUS(r), "flush after puts");
      } else {
        st.flush_request.reset(r);
        ++st.outstanding;
        st.last_progress = absl::Now();
        return;
      }
    }
    if (!st.flush_status.ok()) {
      for (State::Op& op : st.ops) op.status = st.flush_status;
      any_failed = true;
    }
  }
  st.finished = true;
  if (ep_->failed()) {
    for (State::Op& op : st.ops) {
      // A put that was not flushed is not known to have landed.
      if (st.direction == Direction::kPut && op.status.ok()) op.status = ep_->status();
    }
  }
  if (!any_failed && !ep_->failed()) {
    st.final_status = absl::OkStatus();
    return;
  }
  const absl::Status cause = ep_->failed() ? ep_->status() : [&] {
    for (const State::Op& op : st.ops) {
      if (!op.status.ok()) return op.status;
    }
    return absl::OkStatus();
  }();
  st.final_status = absl::Status(
      cause.code(), absl::StrCat(DirectionName(st.direction), " batch failed, ", num_ok(), "/",
                                 st.ops.size(), " ops completed: ", cause.message()));
}

void Transfer::DrainAfterAbort() {
  // Force-closing completes outstanding requests with an error on the next progress passes.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(250);
  while (state_->outstanding > 0 && absl::Now() < deadline) {
    ep_->worker().WaitForEvents(absl::Milliseconds(5));
  }
}

absl::StatusOr<bool> Transfer::Test() {
  if (!state_->finished) {
    ep_->worker().Progress();
    Progressed();
  }
  if (!state_->finished) return false;
  if (!state_->final_status.ok()) return state_->final_status;
  return true;
}

absl::Status Transfer::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Worker& worker = ep_->worker();
  // Sleep slices short enough for the watchdog to fire on time.
  const absl::Duration slice =
      std::min(absl::Milliseconds(100), ep_->options().peer_timeout / 4);
  while (true) {
    while (worker.Progress() != 0) {
    }
    Progressed();
    if (state_->finished) return state_->final_status;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          DirectionName(state_->direction), " batch: ", state_->outstanding,
          " requests still in flight after ", absl::FormatDuration(timeout)));
    }
    worker.WaitForEvents(std::min(slice, deadline - now));
  }
}

Transfer::~Transfer() {
  if (!state_->finished && state_->outstanding > 0) {
    ep_->Abort(absl::CancelledError("transfer destroyed while in flight"));
    DrainAfterAbort();
  }
  if (state_->outstanding > 0) {
    // A request never returned: its callback may still run, so its state must stay valid.
    for (auto& op : state_->ops) (void)op.request.release();
    (void)state_->flush_request.release();
    (void)state_.release();
  }
}

}  // namespace oscarkv::transport
