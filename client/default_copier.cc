#include "client/default_copier.h"

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
  }
  return SelectDeviceCopier(selection);
}

}  // namespace zcc::client_internal
