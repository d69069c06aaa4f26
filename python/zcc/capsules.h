// What zcc's extension modules hand each other as Python capsules: the CUDA
// module (cuda_module.cc, which links the CUDA runtime) gives _zcc.so
// (module.cc, which does not) a device copier or daemon-pull's copier
// factory. Both modules are built from this tree with the same compiler and
// libraries, so these C++ types cross between them as they are.
#ifndef ZCC_PYTHON_ZCC_CAPSULES_H_
#define ZCC_PYTHON_ZCC_CAPSULES_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "copy/device_copier.h"
#include "cuda/ipc_pull_copier.h"

namespace zcc {

// Holds a std::shared_ptr<DeviceCopier>*, valid for the capsule's lifetime.
inline constexpr char kCopierCapsule[] = "zcc.DeviceCopier";

// Holds a DaemonPullChoice*: connect(copier=zcc.daemon_pull(device)).
inline constexpr char kDaemonPullCapsule[] = "zcc.DaemonPull";

struct DaemonPullChoice {
  int device = 0;
  // ClientOptions::daemon_pull_copier.
  std::function<absl::StatusOr<std::shared_ptr<DeviceCopier>>(IpcPullCopierOptions)> factory;
};

}  // namespace zcc

#endif  // ZCC_PYTHON_ZCC_CAPSULES_H_
