// A fixed pool of worker threads running queued tasks in FIFO order. The destructor runs every
// task already queued, then joins.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace oscarkv::client {

class TaskPool {
 public:
  explicit TaskPool(int threads) {
    for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
      workers_.emplace_back([this] { Work(); });
    }
  }
  ~TaskPool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (auto& t : workers_) t.join();
  }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Submit(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](TaskPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
              return p->stopping_ || !p->queue_.empty();
            },
            this));
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace oscarkv::client
