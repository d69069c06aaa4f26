// CompletionQueue: the completions of one File's requests, handed over from
// the threads that run them (an object store's ranged reads, a recovered
// step's pulls from peers) to the thread that waits for them
// (File::WaitForCompletion), in the order they finished.
//
// Thread-safety: Push from any thread; Wait and HasCompletion from the
// file's user. The caller's in-flight count is the file's, changed by Wait.
#ifndef ZCC_STORAGE_COMPLETION_QUEUE_H_
#define ZCC_STORAGE_COMPLETION_QUEUE_H_

#include <cstdint>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "storage/storage.h"

namespace zcc::storage {

class CompletionQueue {
 public:
  void Push(IoCompletion c) ABSL_LOCKS_EXCLUDED(mu_) {
    zcc::MutexLock lock(&mu_);
    done_.push_back(std::move(c));
  }
  // The next completion, waiting for one; decrements `*in_flight`.
  // FailedPrecondition when nothing is in flight or done.
  absl::StatusOr<IoCompletion> Wait(uint32_t* in_flight) ABSL_LOCKS_EXCLUDED(mu_) {
    zcc::MutexLock lock(&mu_);
    if (done_.empty() && *in_flight == 0) {
      return absl::FailedPreconditionError("no request in flight");
    }
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !done_.empty(); };
    mu_.Await(absl::Condition(&ready));
    IoCompletion c = std::move(done_.front());
    done_.pop_front();
    --*in_flight;
    return c;
  }
  bool HasCompletion() const ABSL_LOCKS_EXCLUDED(mu_) {
    zcc::MutexLock lock(&mu_);
    return !done_.empty();
  }

 private:
  mutable zcc::Mutex mu_;
  std::deque<IoCompletion> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_COMPLETION_QUEUE_H_
