// Chooses the DeviceCopier backend for a trainer process: the CUDA copier
// where CUDA works, the host copier otherwise, with one log line saying why
// it fell back.
//
//   CopierSelection sel;                 // kAuto, device 0, 64 MiB chunks
//   sel.device = local_rank;
//   ZCC_ASSIGN_OR_RETURN(std::shared_ptr<DeviceCopier> copier, SelectDeviceCopier(sel));
//
// Thread-safe (no shared state). The copier returned is owned by the caller.
#ifndef ZCC_CUDA_COPIER_SELECT_H_
#define ZCC_CUDA_COPIER_SELECT_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "copy/device_copier.h"

namespace zcc {

struct CopierSelection {
  enum class Backend {
    kAuto,  // CUDA if usable in this process, else host (one WARNING line).
    kHost,  // HostCopier: tensors must be host memory.
    kCuda,  // The CUDA copier, or an error: never silently the host copier.
  };
  Backend backend = Backend::kAuto;
  // The CUDA device holding the trainer's tensors (the local rank's GPU).
  int device = 0;
  // Bytes per cudaMemcpyAsync (CUDA) or per memcpy chunk (host).
  size_t chunk_bytes = size_t{64} << 20;
};

// kHost: a HostCopier with `chunk_bytes`.
// kCuda: NewCudaCopier({device, chunk_bytes}) or its error: FailedPrecondition
//   (no device, driver missing, too old or a stub), Unavailable (device held
//   by another process), Unimplemented (built with --config=nocuda),
//   InvalidArgument (no such device, chunk_bytes 0), others from the runtime.
// kAuto: the CUDA copier if it can be made. If CUDA is unusable in this
//   process — FailedPrecondition, Unavailable or Unimplemented above — logs one
//   WARNING line, "zcc: no usable CUDA device (<reason>); using the host copy
//   backend", and returns a HostCopier. Any other error is returned, not
//   papered over: then CUDA works here, the trainer's tensors are most likely
//   device memory, and a host copier would memcpy from device pointers.
// Note that kAuto cannot see the tensors: a trainer whose tensors are on a GPU
// that this process's CUDA runtime cannot use (for instance zcc built against
// a newer CUDA than the driver supports while the trainer uses an older
// runtime) must ask for kCuda to get an error rather than a host copier.
absl::StatusOr<std::shared_ptr<DeviceCopier>> SelectDeviceCopier(const CopierSelection& selection);

// "auto", "host" or "cuda" (for a flag or an environment variable);
// InvalidArgument otherwise.
absl::StatusOr<CopierSelection::Backend> ParseCopierBackend(absl::string_view name);

}  // namespace zcc

#endif  // ZCC_CUDA_COPIER_SELECT_H_
