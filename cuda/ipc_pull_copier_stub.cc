// The CPU-only stand-in for ipc_pull_copier.cu, linked with --config=nocuda.
#include "absl/status/status.h"
#include "cuda/ipc_pull_copier.h"

namespace zcc {

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewIpcPullCopier(IpcPullCopierOptions) {
  return absl::UnimplementedError("built without CUDA (--config=nocuda)");
}

}  // namespace zcc
