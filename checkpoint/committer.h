// Turns a complete step-N.partial/ into the committed step-N/. Run by the
// daemon that serves global rank 0 of a job.
//
// A step is complete when every rank's manifest (r00000 .. r<world-1>) is
// present; manifests are written last by each rank, so their presence means
// the shard files are durable. Commit then: validates every manifest (same
// job, step and world size; files present with the announced sizes; no tensor
// key written twice), writes the index files and COMMITTED, fsyncs, renames the
// directory to step-N/, fsyncs the job directory and swaps `latest` atomically.
// A crash at any point leaves either the old state or the new one visible:
// restore only ever picks directories named step-N that contain COMMITTED.
//
// On an object store (no rename; step_dirs.h) the ranks wrote into step-N/
// itself: the same checks, then the index files and COMMITTED are written
// there (each object appears whole or not at all), COMMITTED last, and then
// `latest`. A step-N/ without COMMITTED is never restored, so a crash at any
// point again leaves the old state or the new one.
//
// Thread-safety: stateless; callers serialise commits of the same job.
#ifndef ZCC_CHECKPOINT_COMMITTER_H_
#define ZCC_CHECKPOINT_COMMITTER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

enum class CommitOutcome {
  kCommitted,
  kWaiting,  // some rank's manifest is not there yet
};

struct CommitResult {
  CommitOutcome outcome = CommitOutcome::kWaiting;
  uint32_t manifests_present = 0;
  uint64_t total_bytes = 0;  // all shard files of the step
  // Waiting because the manifests name different runs of the job, or
  // different timelines of one run (one is left from before the step was
  // written again); `mixed` says which ranks name which.
  bool mixed_runs = false;
  std::string mixed;
};

// `write_began`: when the step's first rank began writing it, for where
// `latest` names a newer step. Where the storage swaps files conditionally
// (an object store, where zccds on several nodes may commit) `latest` then
// moves back to this step only if that newer step was committed before
// this one began (a timeline abandoned when training resumed from an older
// step); a commit that finishes after a newer one leaves `latest` alone,
// and two commits racing for it never interleave. InfiniteFuture (the
// default): every newer step counts as abandoned, as on a file system,
// where one committer per job writes `latest`. `written_in` (not empty):
// the directory the step was written into in place of step-N.partial (a
// step recovered from the peer tier is written into one of its own,
// RecoveringStepDir); ignored where steps commit in place.
absl::StatusOr<CommitResult> TryCommit(const std::string& job_dir, const std::string& job_id,
                                       int64_t step, uint32_t world_size,
                                       storage::Storage* storage = nullptr,
                                       absl::Time write_began = absl::InfiniteFuture(),
                                       const std::string& written_in = "");

// Points `latest` of `job_dir` at committed step `step`, as TryCommit does
// last (see there for `write_began`). Where the storage swaps a file
// conditionally (an object store, several zccds) the write is a
// compare-and-swap on what was read, tried again when another writer came
// first; elsewhere one committer per job writes it.
absl::Status PointLatest(storage::Storage& fs, const std::string& job_dir, int64_t step,
                         absl::Time write_began);

// A run went on from step `restored` (it restored that step and trained
// on): where `latest` names a newer step, the run that wrote it was left
// behind, and `latest` is pointed back at the newest committed step up to
// `restored`, whatever newer step it names: the caller knows that none of
// the run that went on is committed yet. With `only_from`, only where it
// names that step (one of the run left behind, committed late); with
// `not_after`, not past a step committed then or later (nor within the
// second before: commit times have whole seconds). Where the storage swaps
// conditionally, a `latest` changed meanwhile stays. What was done:
struct LatestBack {
  int64_t named = -1;    // what `latest` named (-1: nothing)
  int64_t back_to = -1;  // what it names now, where it was moved
  // False where no step up to `restored` is committed here: `latest` then
  // names `restored` itself, a step this directory does not hold, so that
  // readers find none of its steps on the timeline (CommittedOnTimeline)
  // until the run that went on commits one, rather than the run left
  // behind's.
  bool committed = true;
};
// `back_to` -1 where there was nothing to move.
absl::StatusOr<LatestBack> PointLatestBack(storage::Storage& fs, const std::string& job_dir,
                                           int64_t restored,
                                           std::optional<int64_t> only_from = std::nullopt,
                                           absl::Time not_after = absl::InfiniteFuture());

// Makes a step-N.partial/ that HoldsReplacedStep (step_dirs.h) harmless:
// removes its COMMITTED and the manifests no newer than it (the replaced
// step's), and keeps what a write of step N put there since. Returns the
// manifests removed.
absl::StatusOr<uint32_t> ForgetReplacedStep(storage::Storage& fs, const std::string& job_dir,
                                            int64_t step);

// A run went on from step `restored` at `at`: the manifests written before
// `at` into the step-N.partial/ directories of steps after `restored` are
// the run left behind's (on any node), and would complete a step the run
// that went on writes again with that run's bytes (a going back within one
// registration keeps the run id). Removes them where steps are renamed into
// place (in place, each rank's write of the step replaces its own first);
// returns how many. Manifests written since, a step-N.partial/ holding
// COMMITTED (a commit's; but one holding the contents a commit replaced
// goes whole, HoldsReplacedStep) and a peer tier's step-N.recovered.partial/
// stay.
absl::StatusOr<uint32_t> ForgetLeftBehindParts(storage::Storage& fs, const std::string& job_dir,
                                               int64_t restored, absl::Time at);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_COMMITTER_H_
