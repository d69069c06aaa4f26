// Validation of names that come from outside the daemon (RPCs, manifests read
// back from disk). Each returns InvalidArgument with a message that says what
// is wrong, so the caller can pass it straight back to the user.
#ifndef ZCC_COMMON_VALIDATE_H_
#define ZCC_COMMON_VALIDATE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zcc {

inline constexpr size_t kMaxJobIdBytes = 128;
inline constexpr size_t kMaxTensorNameBytes = 512;

// The safetensors header's metadata key, which no tensor may take.
inline constexpr char kReservedTensorName[] = "__metadata__";

// Job ids become directory and shared-memory names: 1..128 characters from
// [A-Za-z0-9_.-], not "." or "..", not starting with '.' or '-', not
// "latest", "latest.*", "step-*" or "metadata" (entries of a job directory).
absl::Status ValidateJobId(absl::string_view job_id);

// Where a job directory keeps the files its trainer stored with the job
// (PutJobFile: config.json, tokenizer files), which `zccctl export` copies.
inline constexpr char kJobMetadataDirName[] = "metadata";
inline constexpr size_t kMaxJobFileNameBytes = 128;
inline constexpr size_t kMaxJobFileBytes = size_t{16} << 20;

// A job file's name: 1..128 characters from [A-Za-z0-9_.-], not starting
// with '.' (so never "." or "..").
absl::Status ValidateJobFileName(absl::string_view name);

// Tensor names are checkpoint keys: 1..512 bytes of valid UTF-8, no NUL or other control
// characters (bytes < 0x20 and 0x7f), not a JSON-hostile '"' or '\\', not
// "__metadata__". Every writer and reader of a checkpoint accepts every name
// this accepts. '/' and '.' are legitimate ("model.layers.0.attn/q") and
// round-trip unchanged.
absl::Status ValidateTensorName(absl::string_view name);

// A run id or a timeline (RegisterRequest.run_id, RestoreRequest.timeline),
// written into manifests: at most 128 printable ASCII characters without
// spaces, quotes or backslashes; `what` names it in the error. Empty is
// allowed (none given).
inline constexpr size_t kMaxRunTagBytes = 128;
absl::Status ValidateRunTag(absl::string_view tag, absl::string_view what);

}  // namespace zcc

#endif  // ZCC_COMMON_VALIDATE_H_
