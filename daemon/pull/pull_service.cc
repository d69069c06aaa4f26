#include "daemon/pull/pull_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace zcc::daemon {

PullService::PullService(bool enabled, PullEngineFactory factory)
    : enabled_(enabled), factory_(std::move(factory)) {}

absl::StatusOr<PullEngine*> PullService::Engine() {
  zcc::MutexLock lock(&mu_);
  if (!tried_) {
    tried_ = true;
    if (!factory_) {
      engine_error_ = absl::UnimplementedError("this zccd has no CUDA engine");
    } else {
      absl::StatusOr<std::unique_ptr<PullEngine>> made = factory_();
      if (made.ok()) {
        engine_ = std::move(*made);
        ZCC_LOG(INFO) << "daemon-pull: CUDA engine ready";
      } else {
        engine_error_ = made.status();
        ZCC_LOG(WARNING) << "daemon-pull is enabled but unavailable: " << engine_error_;
      }
    }
  }
  if (engine_ == nullptr) return engine_error_;
  return engine_.get();
}

absl::StatusOr<bool> PullService::Decide(const v1::RegisterRequest& req, std::string* why_not) {
  if (req.daemon_pull() == v1::DAEMON_PULL_OFF) return false;
  if (req.daemon_pull() != v1::DAEMON_PULL_REQUIRED &&
      req.daemon_pull() != v1::DAEMON_PULL_IF_ENABLED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown daemon_pull value ", static_cast<int>(req.daemon_pull())));
  }
  if (req.cuda_device() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", req.cuda_device(), " is negative"));
  }
  absl::Status unavailable;
  if (!enabled_) {
    unavailable = absl::FailedPreconditionError(
        "zccd does not copy trainers' device tensors (daemon_pull is off in its config; turning "
        "it on costs a CUDA context per GPU in zccd)");
  } else if (absl::StatusOr<PullEngine*> engine = Engine(); !engine.ok()) {
    unavailable = absl::FailedPreconditionError(
        absl::StrCat("zccd cannot use CUDA for daemon-pull: ", engine.status().message()));
  }
  if (unavailable.ok()) return true;
  if (req.daemon_pull() == v1::DAEMON_PULL_REQUIRED) return unavailable;
  *why_not = std::string(unavailable.message());
  return false;
}

absl::StatusOr<std::unique_ptr<RankPuller>> PullService::Attach(PullAttachment attachment) {
  ZCC_ASSIGN_OR_RETURN(PullEngine * engine, Engine());
  return engine->Attach(std::move(attachment));
}

void PullService::FillStatus(v1::StatusResponse* resp) const {
  resp->set_daemon_pull_enabled(enabled_);
  PullEngine* engine = nullptr;
  {
    zcc::MutexLock lock(&mu_);
    if (tried_ && engine_ == nullptr) {
      resp->set_daemon_pull_unavailable(std::string(engine_error_.message()));
    }
    engine = engine_.get();
  }
  if (engine == nullptr) return;
  for (const PullDeviceStatus& d : engine->Devices()) {
    v1::PullDeviceStatus* out = resp->add_pull_devices();
    out->set_device(d.device);
    out->set_rank_pullers(d.rank_pullers);
    out->set_context_resets(d.resets);
    out->set_gpu_memory_bytes(d.gpu_memory_bytes);
  }
}

}  // namespace zcc::daemon
