// The copier a Client uses when ClientOptions::copier is null, chosen by
// ClientOptions::copy_backend. Two definitions, one per client library:
//   //client:client       default_copier.cc: host, CUDA or auto
//                         (cuda/copier_select.h; links the CUDA runtime in
//                         CUDA builds)
//   //client:client_host  default_copier_host.cc: the host copier only, so
//                         that a binary linking it (the Python module) never
//                         needs the CUDA runtime; kCuda and kAuto are refused
//                         there with what to pass instead.
#ifndef ZCC_CLIENT_DEFAULT_COPIER_H_
#define ZCC_CLIENT_DEFAULT_COPIER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "copy/device_copier.h"
#include "cuda/ipc_pull_copier.h"

namespace zcc::client_internal {

// Null for kCudaIpc: each registration makes its daemon-pull copier.
absl::StatusOr<std::shared_ptr<DeviceCopier>> DefaultCopier(const ClientOptions& options);

// The daemon-pull copier of one registration (cuda/ipc_pull_copier.h);
// FailedPrecondition in the host-only client.
absl::StatusOr<std::shared_ptr<DeviceCopier>> DaemonPullCopier(IpcPullCopierOptions options);

}  // namespace zcc::client_internal

#endif  // ZCC_CLIENT_DEFAULT_COPIER_H_
