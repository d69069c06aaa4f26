#include "checkpoint/retention.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {

namespace {

// Removes committed step directory `dir`.
absl::Status RemoveStep(storage::Storage& fs, const std::string& dir) {
  // Drop COMMITTED first so that an interrupted removal never leaves a
  // half-deleted directory that still looks committed.
  ZCC_RETURN_IF_ERROR(fs.Remove(JoinPath(dir, format::kCommittedFileName)));
  ZCC_RETURN_IF_ERROR(fs.SyncDir(dir));
  return fs.RemoveTree(dir);
}

// What of a job directory's entries other than committed steps is debris
// once old enough.
enum class Debris { kNone, kPartial, kUncommittedStep, kTempFile };

Debris Classify(storage::Storage& fs, const std::string& job_dir, const std::string& name) {
  if (absl::StartsWith(name, "step-")) {
    if (absl::EndsWith(name, ".partial") || absl::EndsWith(name, ".superseded")) {
      return Debris::kPartial;
    }
    // A step directory without COMMITTED is a retention removal cut short;
    // where steps commit in place, it may also be one still being written.
    if (format::ParseStepDirName(name).ok() &&
        absl::IsNotFound(fs.Stat(JoinPath(JoinPath(job_dir, name), format::kCommittedFileName))
                             .status())) {
      return CommitsInPlace(fs, job_dir) ? Debris::kPartial : Debris::kUncommittedStep;
    }
    return Debris::kNone;
  }
  // An atomic write of `latest` cut short (storage::WriteFileAtomic's name).
  if (absl::StartsWith(name, absl::StrCat(format::kLatestFileName, ".tmp."))) {
    return Debris::kTempFile;
  }
  return Debris::kNone;
}

}  // namespace

absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const std::set<int64_t>& protected_steps,
                                               absl::Duration partial_max_age,
                                               storage::Storage* fs) {
  RetentionGuard guard;
  guard.may_remove = [&protected_steps](int64_t step) { return protected_steps.count(step) == 0; };
  return ApplyRetention(job_dir, policy, guard, partial_max_age, fs);
}

absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const RetentionGuard& guard,
                                               absl::Duration partial_max_age,
                                               storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  RetentionResult result;
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir, &fs));
  std::set<int64_t> keep;
  auto latest = ReadLatest(job_dir, &fs);
  // Unreadable (EIO, a stale handle, a store's error, a garbled file): which
  // steps it leaves out is not known, and counting a run left behind among
  // the newest kept would remove the step it names. Nothing goes this time.
  if (!latest.ok() && !absl::IsNotFound(latest.status())) {
    return absl::Status(latest.status().code(),
                        absl::StrCat("retention of ", job_dir, " removes nothing: ",
                                     latest.status().message()));
  }
  if (latest.ok()) {
    keep.insert(*latest);
    // Steps above `latest` are a run's that another went back from (or a
    // commit finishing now): neither counted among the newest kept nor
    // removed here; the run that went on replaces or passes them.
    steps.erase(std::upper_bound(steps.begin(), steps.end(), *latest), steps.end());
  }
  const uint32_t keep_last = std::max<uint32_t>(policy.keep_last, 1);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t step = steps[i];
    const bool recent = steps.size() - i <= keep_last;
    const bool milestone = policy.keep_every > 0 && step % policy.keep_every == 0;
    if (recent || milestone || keep.count(step) > 0) continue;
    if (guard.may_remove && !guard.may_remove(step)) continue;
    const absl::Status removed = RemoveStep(fs, JoinPath(job_dir, format::StepDirName(step)));
    if (guard.done) guard.done(step);
    ZCC_RETURN_IF_ERROR(removed);
    result.removed_steps.push_back(step);
  }

  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.List(job_dir));
  const absl::Time now = absl::Now();
  for (const std::string& name : names) {
    const Debris debris = Classify(fs, job_dir, name);
    if (debris == Debris::kNone) continue;
    const std::string path = JoinPath(job_dir, name);
    auto info = fs.Stat(path);
    if (!info.ok()) continue;  // gone meanwhile
    // A removal cut short is debris at any age; what may still be written
    // only once it is older than a commit may take.
    if (debris != Debris::kUncommittedStep && now - info->modified < partial_max_age) continue;
    if (debris == Debris::kPartial && guard.may_remove_partial) {
      auto step = format::ParseStepDirName(name.substr(0, name.find('.')));
      if (step.ok() && !guard.may_remove_partial(*step)) continue;
    }
    ZCC_RETURN_IF_ERROR(fs.RemoveTree(path));
    result.removed_partials.push_back(name);
  }
  if (!result.removed_steps.empty() || !result.removed_partials.empty()) {
    ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
  }
  return result;
}

absl::StatusOr<std::vector<LeftBehindStep>> LeftBehindSteps(const std::string& job_dir,
                                                            storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  std::vector<LeftBehindStep> above;
  // `latest` as read, and the time of the write that made it so: stated
  // before and after the read, and nothing listed where another node wrote
  // it in between (its step read with the other write's time would list
  // that node's newest commit).
  const std::string latest_path = JoinPath(job_dir, format::kLatestFileName);
  auto before = fs.Stat(latest_path);
  auto latest = ReadLatest(job_dir, &fs);
  if (absl::IsNotFound(latest.status()) || absl::IsDataLoss(latest.status())) return above;
  if (!latest.ok()) return latest.status();
  ZCC_ASSIGN_OR_RETURN(const storage::FileInfo named, fs.Stat(latest_path));
  if (!before.ok() || before->modified != named.modified || before->size != named.size) {
    return above;
  }
  ZCC_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, ListCommittedSteps(job_dir, &fs));
  for (int64_t step : steps) {
    if (step <= *latest) continue;
    auto committed = fs.Stat(
        JoinPath(JoinPath(job_dir, format::StepDirName(step)), format::kCommittedFileName));
    if (committed.ok() && committed->modified < named.modified) {
      above.push_back({step, committed->modified});
    }
  }
  return above;
}

std::vector<LeftBehindStep> WithoutTakenUp(std::vector<LeftBehindStep> above,
                                           int64_t went_on_from) {
  if (went_on_from < 0) return above;
  auto taken = std::find_if(above.begin(), above.end(),
                            [&](const LeftBehindStep& s) { return s.step == went_on_from; });
  if (taken == above.end()) return above;
  const absl::Time committed = taken->committed;
  above.erase(std::remove_if(above.begin(), above.end(),
                             [&](const LeftBehindStep& s) {
                               return s.step <= went_on_from && s.committed <= committed;
                             }),
              above.end());
  return above;
}

absl::StatusOr<std::vector<int64_t>> RemovePassedSteps(const std::string& job_dir,
                                                       const std::vector<LeftBehindStep>& passed,
                                                       const RetentionGuard& guard,
                                                       storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  std::vector<int64_t> removed;
  if (passed.empty()) return removed;
  ZCC_ASSIGN_OR_RETURN(const int64_t latest, ReadLatest(job_dir, &fs));
  // (One that cannot be removed does not keep the others: each is listed
  // for removal only until latest passes it.)
  absl::Status first_error;
  for (const LeftBehindStep& left : passed) {
    const int64_t step = left.step;
    if (step >= latest) continue;
    const std::string dir = JoinPath(job_dir, format::StepDirName(step));
    auto committed = fs.Stat(JoinPath(dir, format::kCommittedFileName));
    if (!committed.ok() || committed->modified != left.committed) continue;
    if (guard.may_remove && !guard.may_remove(step)) continue;
    const absl::Status st = RemoveStep(fs, dir);
    if (guard.done) guard.done(step);
    if (!st.ok()) {
      if (first_error.ok()) first_error = Annotate(st, dir);
      continue;
    }
    removed.push_back(step);
  }
  if (!removed.empty()) {
    const absl::Status synced = fs.SyncDir(job_dir);
    if (first_error.ok()) first_error = synced;
  }
  ZCC_RETURN_IF_ERROR(first_error);
  return removed;
}

}  // namespace zcc::checkpoint
