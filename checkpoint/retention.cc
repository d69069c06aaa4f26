#include "checkpoint/retention.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"

namespace zcc::checkpoint {

namespace {

// Removes committed step directory `dir`.
absl::Status RemoveStep(const std::string& dir) {
  // Drop COMMITTED first so that an interrupted removal never leaves a
  // half-deleted directory that still looks committed.
  const std::string committed = JoinPath(dir, format::kCommittedFileName);
  if (::unlink(committed.c_str()) != 0) return ErrnoToStatus(errno, "unlink " + committed);
  ZCC_RETURN_IF_ERROR(FsyncDir(dir));
  return RemoveTree(dir);
}

}  // namespace

absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const std::set<int64_t>& protected_steps,
                                               absl::Duration partial_max_age) {
  RetentionGuard guard;
  guard.may_remove = [&protected_steps](int64_t step) { return protected_steps.count(step) == 0; };
  return ApplyRetention(job_dir, policy, guard, partial_max_age);
}

absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const RetentionGuard& guard,
                                               absl::Duration partial_max_age) {
  RetentionResult result;
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir));
  std::set<int64_t> keep;
  auto latest = ReadLatest(job_dir);
  if (latest.ok()) keep.insert(*latest);
  const uint32_t keep_last = std::max<uint32_t>(policy.keep_last, 1);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t step = steps[i];
    const bool recent = steps.size() - i <= keep_last;
    const bool milestone = policy.keep_every > 0 && step % policy.keep_every == 0;
    if (recent || milestone || keep.count(step) > 0) continue;
    if (guard.may_remove && !guard.may_remove(step)) continue;
    const absl::Status removed = RemoveStep(JoinPath(job_dir, format::StepDirName(step)));
    if (guard.done) guard.done(step);
    ZCC_RETURN_IF_ERROR(removed);
    result.removed_steps.push_back(step);
  }

  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(job_dir));
  const absl::Time now = absl::Now();
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, "step-")) continue;
    const bool partial = absl::EndsWith(name, ".partial") || absl::EndsWith(name, ".superseded");
    // A step directory without COMMITTED is a retention removal that was cut short.
    const bool uncommitted_step = format::ParseStepDirName(name).ok() &&
                                  !PathExists(JoinPath(JoinPath(job_dir, name),
                                                       format::kCommittedFileName));
    if (!partial && !uncommitted_step) continue;
    const std::string dir = JoinPath(job_dir, name);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) continue;
    // To the nanosecond: whole seconds make a directory up to a second older.
    if (partial && now - absl::TimeFromTimespec(st.st_mtim) < partial_max_age) continue;
    if (partial && guard.may_remove_partial) {
      auto step = format::ParseStepDirName(name.substr(0, name.find('.')));
      if (step.ok() && !guard.may_remove_partial(*step)) continue;
    }
    ZCC_RETURN_IF_ERROR(RemoveTree(dir));
    result.removed_partials.push_back(name);
  }
  if (!result.removed_steps.empty() || !result.removed_partials.empty()) {
    ZCC_RETURN_IF_ERROR(FsyncDir(job_dir));
  }
  return result;
}

}  // namespace zcc::checkpoint
