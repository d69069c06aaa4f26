#include "ema/worker_group.h"

#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc::ema {

absl::StatusOr<std::unique_ptr<WorkerGroup>> WorkerGroup::Create(int size) {
  if (size < 1 || size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker group size must be in [1, 1024], got ", size));
  }
  std::unique_ptr<WorkerGroup> group(new WorkerGroup(size));
  group->workers_.reserve(size - 1);
  for (int i = 1; i < size; ++i) {
    try {
      group->workers_.emplace_back([g = group.get(), i] { g->WorkerLoop(i); });
    } catch (const std::system_error& e) {
      // The destructor stops and joins the threads already started.
      return ErrnoToStatus(e.code().value(), "starting an EMA worker thread");
    }
  }
  return group;
}

WorkerGroup::~WorkerGroup() {
  {
    zcc::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void WorkerGroup::RunOnAll(absl::FunctionRef<void(int)> fn) {
  zcc::MutexLock run(&run_mu_);
  if (size_ > 1) {
    zcc::MutexLock lock(&mu_);
    fn_ = &fn;
    running_ = size_ - 1;
    ++generation_;
  }
  fn(0);
  if (size_ > 1) {
    zcc::MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
    mu_.Await(absl::Condition(&all_done));
    fn_ = nullptr;
  }
}

void WorkerGroup::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const absl::FunctionRef<void(int)>* fn;
    {
      zcc::MutexLock lock(&mu_);
      auto has_work = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      seen = generation_;
      fn = fn_;
    }
    (*fn)(index);
    zcc::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace zcc::ema
