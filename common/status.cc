#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zcc {
namespace {

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
      return absl::StatusCode::kInvalidArgument;
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::StatusCode::kUnavailable;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    case EIO:
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  char buf[128];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return absl::Status(CodeForErrno(err), absl::StrCat(context, ": ", msg, " (errno ", err, ")"));
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace zcc
