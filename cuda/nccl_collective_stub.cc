// The CPU-only stand-in for nccl_collective.cu, linked with --config=nocuda.
#include "absl/status/status.h"
#include "cuda/nccl_collective.h"

namespace zcc {

absl::StatusOr<std::unique_ptr<Collective>> NewNcclCollective(void*, int) {
  return absl::UnimplementedError("built without CUDA (--config=nocuda): no NCCL collective");
}

}  // namespace zcc
