#include "common/task_pool.h"

#include <algorithm>
#include <utility>

namespace zcc {

TaskPool::TaskPool(int threads) : size_(std::max(threads, 1)) {}

TaskPool::~TaskPool() {
  std::vector<std::thread> threads;
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void TaskPool::Post(std::function<void()> task) {
  zcc::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
  if (threads_.empty()) {
    for (int i = 0; i < size_; ++i) threads_.emplace_back([this] { Loop(); });
  }
}

void TaskPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      zcc::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace zcc
