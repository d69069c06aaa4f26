// Ends gRPC calls in flight from another thread: a stopping replicator's
// push of a large piece to a slow peer would otherwise hold zccd's stop until
// the call's deadline (minutes), past the stop timeout.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_CALL_CANCEL_H_
#define ZCC_DAEMON_PEER_CALL_CANCEL_H_

#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zcc::daemon::peer {

class CallCancel {
 public:
  CallCancel() = default;
  CallCancel(const CallCancel&) = delete;
  CallCancel& operator=(const CallCancel&) = delete;

  // Cancels every call in a Scope now and each one that enters a Scope later.
  void CancelAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether CancelAll was called.
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // `ctx`'s call is cancelled by CancelAll while the scope lives (from its
  // start, if CancelAll came first). A null `cancel`: nothing to do.
  class Scope {
   public:
    Scope(CallCancel* cancel, grpc::ClientContext* ctx);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallCancel* const cancel_;
    grpc::ClientContext* const ctx_;
  };

 private:
  mutable zcc::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_CALL_CANCEL_H_
