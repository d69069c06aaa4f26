// WritePool: zccd's writer threads (writer_threads of them), shared by every
// rank: each rank's writer (daemon/rank/rank_writer.h) posts its checkpoint writes
// here, one at a time per rank, so zccd's threads do not grow with its ranks
// and the disks see at most writer_threads writes at once. The threads start
// with the first write.
//
// Thread-safety: Post may be called from any thread. Ownership: owns its
// threads; it must outlive the writers that post to it (zccd's registry owns
// it). The destructor runs the tasks already posted, then joins the threads.
#ifndef ZCC_DAEMON_RANK_WRITE_POOL_H_
#define ZCC_DAEMON_RANK_WRITE_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zcc::daemon {

class WritePool {
 public:
  explicit WritePool(int threads);  // threads >= 1
  ~WritePool();
  WritePool(const WritePool&) = delete;
  WritePool& operator=(const WritePool&) = delete;

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

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_WRITE_POOL_H_
