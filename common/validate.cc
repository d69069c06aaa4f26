#include "common/validate.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace zcc {

absl::Status ValidateJobId(absl::string_view job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id is empty");
  if (job_id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id is ", job_id.size(), " bytes; the limit is ", kMaxJobIdBytes));
  }
  if (job_id.front() == '.' || job_id.front() == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", job_id, "' must not start with '.' or '-'"));
  }
  for (char c : job_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job id contains the character 0x%02x; allowed are letters, digits, '_', '-' and '.'",
          static_cast<unsigned char>(c)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTensorName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  if (name.size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name.substr(0, 64),
                                                   "...' is ", name.size(),
                                                   " bytes; the limit is ", kMaxTensorNameBytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor name '%s' has the forbidden byte 0x%02x at position %d "
          "(control characters, '\"' and '\\' are not allowed)",
          absl::CHexEscape(name.substr(0, 64)), c, i));
    }
  }
  return absl::OkStatus();
}

}  // namespace zcc
