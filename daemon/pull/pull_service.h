// zccd's side of daemon-pull (`copy_backend = cuda_ipc`): whether a
// registration gets it, the CUDA engine that serves it (made on first use,
// so a zccd whose trainers never ask holds no CUDA context), and its status.
//
// Thread-safety: all methods may be called from any thread.
#ifndef ZCC_DAEMON_PULL_PULL_SERVICE_H_
#define ZCC_DAEMON_PULL_PULL_SERVICE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "cuda/ipc_puller.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {

using PullEngineFactory = std::function<absl::StatusOr<std::unique_ptr<PullEngine>>()>;

class PullService {
 public:
  // `enabled`: the config's daemon_pull. `factory`: makes the CUDA engine
  // (null: this zccd was built or started without one).
  PullService(bool enabled, PullEngineFactory factory);

  // Whether the registration gets daemon-pull: DAEMON_PULL_REQUIRED fails
  // (FailedPrecondition, saying why) when it cannot; DAEMON_PULL_IF_ENABLED
  // gets false and the reason in `*why_not`.
  absl::StatusOr<bool> Decide(const v1::RegisterRequest& req, std::string* why_not);

  // Starts serving a granted registration's channel.
  absl::StatusOr<std::unique_ptr<RankPuller>> Attach(PullAttachment attachment);

  void FillStatus(v1::StatusResponse* resp) const;

 private:
  // The engine, made on first call; its error, cached, otherwise.
  absl::StatusOr<PullEngine*> Engine();

  const bool enabled_;
  const PullEngineFactory factory_;
  mutable zcc::Mutex mu_;
  bool tried_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status engine_error_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PullEngine> engine_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_PULL_PULL_SERVICE_H_
