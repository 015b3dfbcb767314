// Asks the scheduler for a short time slice for the calling thread (Linux >= 6.12, EEVDF: a
// SCHED_OTHER thread may set sched_runtime without privilege; its nice value is kept). A thread
// that runs for microseconds per wake-up then gets an earlier deadline and runs ahead of
// CPU-bound work on the same cores instead of waiting behind its slice. Older kernels refuse it
// (returns false, nothing changes). Used by the daemon's local-socket epoll threads and the
// client's local-channel reader thread.
#pragma once

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace oscarkv {

inline bool RequestSchedulerSlice(uint32_t slice_us) {
  struct {  // struct sched_attr (include/uapi/linux/sched/types.h)
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  } attr{};
  attr.size = sizeof(attr);
  attr.policy = 0;  // SCHED_OTHER
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, 0);  // this thread's
  attr.nice = errno == 0 ? nice : 0;
  attr.runtime = uint64_t{slice_us} * 1000;
  return ::syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
}

}  // namespace oscarkv
