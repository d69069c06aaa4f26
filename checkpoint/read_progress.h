// ReadProgress: how far a long read of checkpoint data has come, logged at
// INFO at most once a period ("restore of <dir>: 12.3 of 40.0 GB read in
// 8.1 s, 1.52 GB/s"), so that a restore of hundreds of GB shows that it is
// moving and how fast. The shard reader (shard_file_reader.h) reports each
// chunk of tensor data it has read and hashed; ReadBoxes adds what it plans
// to read to the total. Costs a lock and a clock read per chunk (MiBs).
//
// Thread-safety: thread-safe. Ownership: the reads borrow it through
// IoOptions::progress; it outlives them.
#ifndef ZCC_CHECKPOINT_READ_PROGRESS_H_
#define ZCC_CHECKPOINT_READ_PROGRESS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace zcc::checkpoint {

class ReadProgress {
 public:
  // `what` starts each log line ("restore of /ckpt/job/step-00000100").
  explicit ReadProgress(std::string what, absl::Duration period = absl::Seconds(5));
  ReadProgress(const ReadProgress&) = delete;
  ReadProgress& operator=(const ReadProgress&) = delete;

  // `bytes` more are going to be read.
  void AddPlanned(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // `bytes` of tensor data were read and hashed (alignment padding and
  // headers not counted); logs when a period has passed since the last line.
  void AddRead(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t bytes_planned() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t bytes_read() const ABSL_LOCKS_EXCLUDED(mu_);
  // Since construction.
  absl::Duration elapsed() const;
  // "12.30 GB read in 8.1 s, 1.52 GB/s": the bytes read so far, for a last
  // line.
  std::string Summary() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string what_;
  const absl::Duration period_;
  const absl::Time start_;
  mutable zcc::Mutex mu_;
  uint64_t planned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_line_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_READ_PROGRESS_H_
