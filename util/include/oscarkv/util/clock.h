// Clock: the time seam. Deadlines are kept on a monotonic clock (NowMs) and reported to clients
// in Unix milliseconds (UnixMs). SystemClock is the real one; FakeClock moves only when a test
// advances it, so a test expires leases and reservations without sleeping. Implementations are
// thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace oscarkv {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;   // monotonic
  virtual int64_t UnixMs() const = 0;  // wall clock
};

class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t UnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static SystemClock* Default() {
    static SystemClock clock;
    return &clock;
  }
};

// Starts at `start_ms` on the monotonic scale; UnixMs is a fixed offset from it.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  int64_t UnixMs() const override { return kUnixOffsetMs + now_.load(); }
  void Advance(int64_t ms) { now_.fetch_add(ms); }

  static constexpr int64_t kUnixOffsetMs = 1'700'000'000'000;

 private:
  std::atomic<int64_t> now_;
};

}  // namespace oscarkv
