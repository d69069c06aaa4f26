#include "common/validate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace zcc {

absl::Status ValidateJobFileName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxJobFileNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job file name '", name.substr(0, 64), "' is ",
                                                   name.size(), " bytes; 1..",
                                                   kMaxJobFileNameBytes, " are allowed"));
  }
  if (name.front() == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("job file name '", name, "' must not start with '.'"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job file name contains the character 0x%02x; allowed are letters, digits, '_', '-' "
          "and '.'",
          static_cast<unsigned char>(c)));
    }
  }
  return absl::OkStatus();
}

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
  // A job directory holds its steps and `latest` (and, during a commit,
  // `latest.tmp.*` and `step-*.partial`); a job named like one of those in
  // a root that is itself a job directory would collide with them.
  if (job_id == "latest" || absl::StartsWith(job_id, "latest.") ||
      absl::StartsWith(job_id, "step-") || job_id == kJobMetadataDirName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id '", job_id, "' is reserved: 'latest', 'latest.*', 'step-*' and 'metadata' name "
        "entries of a checkpoint directory"));
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

namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) {
    len = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

}  // namespace

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
  if (name == kReservedTensorName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name '", kReservedTensorName,
        "' is reserved: safetensors files keep their metadata under that key"));
  }
  for (size_t i = 0; i < name.size();) {
    const size_t len = Utf8SequenceLength(name, i);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor name '%s' is not valid UTF-8 at byte %d", absl::CHexEscape(name.substr(0, 64)), i));
    }
    i += len;
  }
  return absl::OkStatus();
}

absl::Status ValidateRunTag(absl::string_view tag, absl::string_view what) {
  if (tag.size() > kMaxRunTagBytes ||
      !std::all_of(tag.begin(), tag.end(),
                   [](char c) { return c > ' ' && c < 127 && c != '"' && c != '\\'; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be at most ", kMaxRunTagBytes,
        " printable characters without spaces, quotes or backslashes"));
  }
  return absl::OkStatus();
}

}  // namespace zcc
