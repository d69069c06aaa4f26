// Pins a registration's staging segment for the copier in the background,
// piece by piece, so that registering returns before gigabytes are pinned.
//
// Pinning is what lets a device copier move bytes by DMA at full speed, and
// it costs: on an H100 node a Checkpointer's construction took 0.9 s for
// 0.8 GB of model and AdamW state, almost all of it cudaHostRegister of the
// three 0.8 GB slots (faulting in and zeroing the fresh pages first), while
// zccd had the step read from disk in 0.4 s. The pieces are the control
// block with slot 0 (where zccd puts a restore), then each further slot; a
// copy waits only for the pieces it touches, so a restore's copies start as
// soon as slot 0 is pinned and the other slots are pinned behind them.
//
// Thread-safety: Await and AwaitAll may be called from any thread; the
// destructor must not race them.
#ifndef ZCC_CLIENT_STAGING_PINS_H_
#define ZCC_CLIENT_STAGING_PINS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "copy/device_copier.h"

namespace zcc::client_internal {

class StagingPins {
 public:
  // Starts registering [base, base + bytes) with `copier`, cut at `cuts`
  // (offsets from base, ascending, each inside the range): one
  // RegisterHostMemory per piece, in order, on a thread of its own.
  StagingPins(std::shared_ptr<DeviceCopier> copier, uint8_t* base, size_t bytes,
              std::vector<size_t> cuts);
  // Stops before the next piece, waits for the one being pinned, and
  // unregisters every piece that was registered.
  ~StagingPins();

  StagingPins(const StagingPins&) = delete;
  StagingPins& operator=(const StagingPins&) = delete;

  // Blocks until every piece overlapping [p, p + n) is registered (at once
  // for memory outside the segment): OK, or the error that stopped the
  // pinning at or before the last of those pieces.
  absl::Status Await(const void* p, size_t n) const;
  absl::Status AwaitAll() const;

 private:
  void Run();
  // The pieces [first, last] that [p, p + n) overlaps; false if none.
  bool Overlapping(const void* p, size_t n, size_t* last) const;
  absl::Status AwaitPieces(size_t count) const;

  const std::shared_ptr<DeviceCopier> copier_;
  // Piece i is [starts_[i], starts_[i + 1]); starts_.back() is the end.
  std::vector<uint8_t*> starts_;
  // Every piece registered: Await's path without the lock (the trainer's
  // snapshots ask before every Enqueue).
  std::atomic<bool> all_done_{false};

  mutable zcc::Mutex mu_;
  size_t registered_ ABSL_GUARDED_BY(mu_) = 0;  // pieces [0, registered_)
  absl::Status failed_ ABSL_GUARDED_BY(mu_);    // stops the pinning; kept
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the thread has nothing more to do
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;
};

}  // namespace zcc::client_internal

#endif  // ZCC_CLIENT_STAGING_PINS_H_
