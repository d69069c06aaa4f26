// The CPU-only stand-in for ipc_puller.cu, linked with --config=nocuda.
#include "absl/status/status.h"
#include "cuda/ipc_puller.h"

namespace zcc {

absl::StatusOr<std::unique_ptr<PullEngine>> NewPullEngine() {
  return absl::UnimplementedError("built without CUDA (--config=nocuda)");
}

}  // namespace zcc
