// TaskPool: a fixed number of threads that run posted tasks in the order they
// were posted; the threads start with the first task. zccd's writer threads
// (writer_threads of them, shared by every rank's writer: daemon/rank/
// rank_writer.h) are one; an object store's requests in flight (storage/s3)
// another.
//
// Thread-safety: Post may be called from any thread. Ownership: owns its
// threads; it must outlive whoever posts to it. The destructor runs the
// tasks already posted, then joins the threads.
#ifndef ZCC_COMMON_TASK_POOL_H_
#define ZCC_COMMON_TASK_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zcc {

class TaskPool {
 public:
  explicit TaskPool(int threads);  // threads >= 1
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  int threads() const { return size_; }
  // Runs `task` on one of the threads, after the tasks posted before it have
  // started.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const int size_;
  zcc::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);  // started by the first Post
};

}  // namespace zcc

#endif  // ZCC_COMMON_TASK_POOL_H_
