// A fixed set of persistent threads that run one function together, so that
// a parallel EMA step costs a wake-up and not a thread start. One group may
// serve many EMAs (zccd shares one among all its ranks: its EMA threads are
// as many as configured, whatever the number of ranks).
//
// RunOnAll(fn) calls fn(i) once for every i in [0, size()): i = 0 on the
// calling thread, the others on the group's worker threads, and returns when
// all calls have returned. Whatever fn(i) wrote is visible to the caller then.
//
// Thread-safety: RunOnAll may be called from any thread; calls run one after
// another (fn must not call RunOnAll). size() from any thread. Ownership: the
// group owns its size() - 1 worker threads; the destructor stops and joins
// them (it must not run concurrently with RunOnAll).
#ifndef ZCC_EMA_WORKER_GROUP_H_
#define ZCC_EMA_WORKER_GROUP_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace zcc::ema {

class WorkerGroup {
 public:
  // Starts `size` - 1 worker threads. InvalidArgument unless 1 <= size <= 1024;
  // ResourceExhausted (or the errno's code) when a thread cannot be started.
  static absl::StatusOr<std::unique_ptr<WorkerGroup>> Create(int size);

  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  int size() const { return size_; }

  void RunOnAll(absl::FunctionRef<void(int)> fn) ABSL_LOCKS_EXCLUDED(run_mu_, mu_);

 private:
  explicit WorkerGroup(int size) : size_(size) {}
  void WorkerLoop(int index);

  const int size_;

  // Held for a whole RunOnAll: one function at a time.
  zcc::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  zcc::Mutex mu_;
  // Bumped by RunOnAll to hand out a new function; workers remember the last
  // generation they ran.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The function of the current generation; valid while RunOnAll waits.
  const absl::FunctionRef<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // workers still inside fn_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> workers_;  // started by Create, joined by the destructor
};

}  // namespace zcc::ema

#endif  // ZCC_EMA_WORKER_GROUP_H_
