// HostCopier: the DeviceCopier backend for machines without a GPU (and the
// fake every GPU-free test uses). "Device" memory is ordinary host memory; the
// copies run with memcpy on one copy thread owned by the copier, so Enqueue()
// returns before the bytes move, exactly as with the CUDA backend. The copy
// thread runs at background priority, so a CPU trainer that keeps every core
// busy leaves it little until its next FenceBeforeUpdate; the fence, which
// must wait for the copy anyway, then finishes it with the waiting thread and
// up to 7 helpers taking its pieces in turn with the copy thread.
//
// Thread-safety: every method may be called from any thread, concurrently.
// Ownership: the copier owns its copy thread; the destructor finishes every
// queued copy, then joins the thread. The caller owns all copied memory and
// keeps it valid until Wait() for the ticket returns (or the copier is gone).
#ifndef ZCC_COPY_HOST_COPIER_H_
#define ZCC_COPY_HOST_COPIER_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "copy/device_copier.h"

namespace zcc {

struct HostCopierOptions {
  // Copies are split into chunks of at most this many bytes (as the CUDA
  // backend does), so a simulated slow device delays each chunk.
  size_t chunk_bytes = size_t{64} << 20;
  // Sleeps this long before each chunk, to simulate a slow device in tests.
  absl::Duration per_chunk_delay = absl::ZeroDuration();
};

// Copies the regions (host memory), with a few threads when they are large
// (64 MiB and more per thread), mapping the sources' pages first: the
// restore path's copy, out of a segment another process filled.
void ParallelCopy(absl::Span<const CopyRegion> regions);
// Maps the pages of [begin, begin + bytes) for reading (best effort).
void PopulateForRead(const void* begin, uint64_t bytes);

class HostCopier final : public DeviceCopier {
 public:
  // Starts the copy thread. InvalidArgument if chunk_bytes is 0 or the delay
  // is negative.
  static absl::StatusOr<std::unique_ptr<HostCopier>> Create(const HostCopierOptions& options);

  // Finishes every queued copy, then stops and joins the copy thread.
  ~HostCopier() override;

  HostCopier(const HostCopier&) = delete;
  HostCopier& operator=(const HostCopier&) = delete;

  std::string name() const override { return "host"; }

  // Nothing to pin in host memory; the registrations are still tracked so that
  // misuse the CUDA backend would reject (double registration, unregistering an
  // unknown base) fails here too, on machines without a GPU.
  absl::Status RegisterHostMemory(void* base, size_t bytes) override;
  absl::Status UnregisterHostMemory(void* base) override;

  // `stream` is ignored. As the interface says, `regions` must stay valid until
  // Wait() for the ticket returns: the queue holds the span, not a copy, so the
  // trainer-thread cost does not grow with the number of tensors beyond the
  // argument check.
  absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion> regions, void* stream) override;
  absl::Status Wait(CopyTicket ticket) override;
  // Blocks until every copy enqueued before the call has finished, helping
  // with the copy in progress (the caller's thread, and more threads when
  // much is left: the trainer waits here with its cores otherwise idle).
  absl::Status FenceBeforeUpdate(void* stream) override;
  // memcpy on the calling thread.
  absl::Status CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) override;

 private:
  struct Job {
    CopyTicket ticket = 0;
    absl::Span<const CopyRegion> regions;
  };

  // One job's regions cut into pieces of at most chunk_bytes (and 8 MiB),
  // which the copy thread and a fence's helpers take in turn.
  struct Work {
    std::vector<CopyRegion> pieces;
    std::atomic<size_t> next{0};      // the next piece nobody has taken
    std::atomic<size_t> finished{0};  // pieces copied
  };

  explicit HostCopier(const HostCopierOptions& options);
  void CopyLoop();
  // Blocks (sleeping on mu_) until every ticket up to `ticket` has completed.
  void AwaitCompleted(CopyTicket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies pieces of `work` until none is left to take.
  void RunPieces(Work& work) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `work`'s remaining pieces on this thread and, when much is left, on
  // helper threads too; returns once those threads are done.
  void Help(const std::shared_ptr<Work>& work) ABSL_LOCKS_EXCLUDED(mu_);

  const HostCopierOptions options_;

  zcc::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  CopyTicket last_issued_ ABSL_GUARDED_BY(mu_) = 0;
  CopyTicket last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  // The job the copy thread is copying (null between jobs).
  std::shared_ptr<Work> current_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<void*, size_t> registered_ ABSL_GUARDED_BY(mu_);

  std::thread copy_thread_;  // Started by Create(), joined by the destructor.
};

}  // namespace zcc

#endif  // ZCC_COPY_HOST_COPIER_H_
