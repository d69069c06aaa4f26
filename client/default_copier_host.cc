#include "client/default_copier.h"

#include "absl/status/status.h"
#include "copy/host_copier.h"

namespace zcc::client_internal {

absl::StatusOr<std::shared_ptr<DeviceCopier>> DefaultCopier(const ClientOptions& options) {
  // Daemon-pull: each registration's copier comes from
  // ClientOptions::daemon_pull_copier.
  if (options.copy_backend == ClientOptions::CopyBackend::kCudaIpc &&
      options.daemon_pull_copier) {
    return std::shared_ptr<DeviceCopier>();
  }
  if (options.copy_backend != ClientOptions::CopyBackend::kHost) {
    return absl::FailedPreconditionError(
        "this client is built without the CUDA copier selection (the host copier only); pass "
        "ClientOptions::copier (from Python: copier=zcc.cuda_copier(device))");
  }
  auto copier = HostCopier::Create(HostCopierOptions());
  if (!copier.ok()) return copier.status();
  return std::shared_ptr<DeviceCopier>(std::move(*copier));
}

absl::StatusOr<std::shared_ptr<DeviceCopier>> DaemonPullCopier(IpcPullCopierOptions) {
  return absl::FailedPreconditionError(
      "this client is built without CUDA (the host copier only): daemon-pull needs "
      "ClientOptions::daemon_pull_copier (from Python: copier=zcc.daemon_pull(device))");
}

}  // namespace zcc::client_internal
