// Where a step's files are while its ranks write them.
//
// On a file system, ranks write into step-N.partial/ and the commit renames
// it to step-N/ once every rank's manifest is there. An object store has no
// rename (storage::Storage::renames is false): ranks write into step-N/
// itself, and the step is committed when COMMITTED appears in it, written
// last. Readers only ever take a step-N/ that holds COMMITTED, on either.
//
// Thread-safety: stateless functions.
#ifndef ZCC_CHECKPOINT_STEP_DIRS_H_
#define ZCC_CHECKPOINT_STEP_DIRS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/file_util.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

// True when steps of `job_dir` in `fs` are written and committed in place.
inline bool CommitsInPlace(const storage::Storage& fs, const std::string& job_dir) {
  return !fs.renames(job_dir);
}

// The directory ranks write step `step` of `job_dir` into.
inline std::string WritingStepDir(const storage::Storage& fs, const std::string& job_dir,
                                  int64_t step) {
  return JoinPath(job_dir, CommitsInPlace(fs, job_dir) ? format::StepDirName(step)
                                              : format::PartialStepDirName(step));
}

// The directory a step recovered from the peer tier is written into where
// steps are renamed into place: one of its own, step-N.recovered.partial/
// (debris to retention as any partial), so that writers of the job's own
// step N, on this node or another, never share it (TryCommit's
// `written_in` takes it to step-N/).
inline std::string RecoveringStepDir(const std::string& job_dir, int64_t step) {
  return JoinPath(job_dir, format::StepDirName(step) + ".recovered.partial");
}

// Whether step-N.partial/ of `job_dir` holds the contents a commit of step N
// replaced (ReplaceStep's move of them cut short): its COMMITTED older than
// step-N/'s, by the storage's own clock. Debris, never a step to commit or
// to write into. False when either cannot be read.
inline bool HoldsReplacedStep(storage::Storage& fs, const std::string& job_dir, int64_t step) {
  auto replaced = fs.Stat(JoinPath(JoinPath(job_dir, format::PartialStepDirName(step)),
                                   format::kCommittedFileName));
  if (!replaced.ok()) return false;
  auto current =
      fs.Stat(JoinPath(JoinPath(job_dir, format::StepDirName(step)), format::kCommittedFileName));
  return current.ok() && replaced->modified < current->modified;
}

// Removes the directory ranks write step `step` of `job_dir` into (an
// abandoned or superseded step's; one already gone is no error).
inline absl::Status RemoveWritingStepDir(storage::Storage& fs, const std::string& job_dir,
                                         int64_t step) {
  const absl::Status removed = fs.RemoveTree(WritingStepDir(fs, job_dir, step));
  return absl::IsNotFound(removed) ? absl::OkStatus() : removed;
}

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_STEP_DIRS_H_
