// Copies the tensors a Restore marks for an early copy
// (RestoreOptions::early_copy) out of the staging slot zccd reads a step
// into, each as soon as zccd has checked it (shm/restore_progress.h), on a
// thread of its own while the Restore RPC waits: the copy overlaps the read
// instead of following it. Only bytes zccd checked are copied; when the
// restore is served from another read (a fallback to an older step, a read
// ahead that was dropped, memory, a restore buffer), the reply's attempt
// differs from the one copied from and CopyOut copies everything again.
//
// Thread-safety: Stop from the thread that made it. Ownership: owns its
// thread; borrows the session and the tensors, which outlive it.
#ifndef ZCC_CLIENT_EARLY_COPY_H_
#define ZCC_CLIENT_EARLY_COPY_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/client_impl.h"

namespace zcc::client_internal {

class EarlyCopy {
 public:
  struct Copied {
    uint64_t attempt = 0;       // the read copied from; 0: none
    std::vector<bool> tensors;  // per registered tensor, copied from `attempt`
    absl::Status status;        // the copier's error, if any
  };

  // Starts copying `early` (per tensor of `refs`, the registration's order)
  // out of `session`'s slots through its copier, on `stream`.
  EarlyCopy(const Session& session, const std::vector<TensorRef>& refs,
            const std::vector<bool>& early, void* stream);
  ~EarlyCopy();
  EarlyCopy(const EarlyCopy&) = delete;
  EarlyCopy& operator=(const EarlyCopy&) = delete;

  // Stops the thread (after the copy under way); what it copied, of which
  // read.
  Copied Stop();

  const Session& session() const { return session_; }

 private:
  void Run();

  const Session& session_;
  const std::vector<TensorRef>& refs_;
  const std::vector<bool> early_;
  void* const stream_;
  std::atomic<bool> stop_{false};
  Copied copied_;  // the thread's until Stop joins it
  std::thread thread_;
};

}  // namespace zcc::client_internal

#endif  // ZCC_CLIENT_EARLY_COPY_H_
