#include "client/default_copier.h"

#include "common/status.h"
#include "cuda/copier_select.h"

namespace zcc::client_internal {

absl::StatusOr<std::shared_ptr<DeviceCopier>> DefaultCopier(const ClientOptions& options) {
  CopierSelection selection;
  selection.device = options.cuda_device;
  switch (options.copy_backend) {
    case ClientOptions::CopyBackend::kHost:
      selection.backend = CopierSelection::Backend::kHost;
      break;
    case ClientOptions::CopyBackend::kCuda:
      selection.backend = CopierSelection::Backend::kCuda;
      break;
    case ClientOptions::CopyBackend::kAuto:
      selection.backend = CopierSelection::Backend::kAuto;
      break;
    case ClientOptions::CopyBackend::kCudaIpc:
      return std::shared_ptr<DeviceCopier>();
  }
  return SelectDeviceCopier(selection);
}

absl::StatusOr<std::shared_ptr<DeviceCopier>> DaemonPullCopier(IpcPullCopierOptions options) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier,
                       NewIpcPullCopier(std::move(options)));
  return std::shared_ptr<DeviceCopier>(std::move(copier));
}

}  // namespace zcc::client_internal
