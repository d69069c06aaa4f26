// Status helpers shared by every zcc module. errno is converted to a Status here
// and nowhere else.
#ifndef ZCC_COMMON_STATUS_H_
#define ZCC_COMMON_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc {

// Call it qualified (zcc::ErrnoToStatus) where an argument is an absl type, or
// ADL also finds absl::ErrnoToStatus.
// Maps an errno value to the closest absl code, with `context` and strerror in
// the message: ENOENT -> NotFound, ENOSPC -> ResourceExhausted, EACCES -> PermissionDenied, ...
absl::Status ErrnoToStatus(int err, absl::string_view context);

// Returns `status` with `context` prepended to its message ("context: message").
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace zcc

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define ZCC_RETURN_IF_ERROR(expr)                      \
  do {                                                 \
    ::absl::Status zcc_status_ = (expr);               \
    if (!zcc_status_.ok()) return zcc_status_;         \
  } while (0)

#define ZCC_CONCAT_INNER_(a, b) a##b
#define ZCC_CONCAT_(a, b) ZCC_CONCAT_INNER_(a, b)

// `lhs` = value of the StatusOr `rexpr`, or returns its status from the enclosing function.
#define ZCC_ASSIGN_OR_RETURN(lhs, rexpr) \
  ZCC_ASSIGN_OR_RETURN_IMPL_(ZCC_CONCAT_(zcc_statusor_, __LINE__), lhs, rexpr)
#define ZCC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // ZCC_COMMON_STATUS_H_
