#include "daemon/restore/restore_tiers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "format/manifest.h"

namespace zcc::daemon {

RestoreTiers::RestoreTiers(std::string job_dir, std::string upload_dir, int64_t requested,
                           storage::Storage* fs)
    : job_dir_(std::move(job_dir)), upload_dir_(std::move(upload_dir)), current_(job_dir_) {
  if (upload_dir_.empty() || requested >= 0) return;
  auto here = checkpoint::ReadLatest(job_dir_, fs);
  auto there = checkpoint::ReadLatest(upload_dir_, fs);
  if (there.ok() && (!here.ok() || *there > *here)) {
    current_ = upload_dir_;
    why_store_first_ = absl::StrCat("the store's latest (", format::StepDirName(*there),
                                    ") is newer than the local root's");
  }
}

bool RestoreTiers::Next() {
  if (upload_dir_.empty() || switched_) return false;
  switched_ = true;
  current_ = current_ == job_dir_ ? upload_dir_ : job_dir_;
  return true;
}

std::optional<RestoreTiers::Elsewhere> RestoreTiers::IntactElsewhere(
    int64_t chosen, int64_t requested, int64_t at_most,
    const std::function<absl::Status(const std::string&)>& verify, storage::Storage* fs) const {
  if (upload_dir_.empty()) return std::nullopt;
  const std::string& other = current_ == job_dir_ ? upload_dir_ : job_dir_;
  auto here = checkpoint::CommittedOnTimeline(current_, fs);
  if (!here.ok()) return std::nullopt;
  for (auto it = here->rbegin(); it != here->rend() && *it > chosen; ++it) {
    const int64_t step = *it;
    if (step > at_most || (requested >= 0 && step != requested)) continue;
    const std::string name = format::StepDirName(step);
    const std::string mine = JoinPath(current_, name);
    const std::string theirs = JoinPath(other, name);
    // Only a copy here that cannot be read (the choice took any other).
    if (verify(mine).ok()) continue;
    auto a = checkpoint::ReadCommitRecord(mine, fs);
    auto b = checkpoint::ReadCommitRecord(theirs, fs);
    if (!a.ok() || !b.ok()) continue;
    const bool same = a->job_id == b->job_id && a->step == b->step &&
                      a->world_size == b->world_size && a->manifest_hash == b->manifest_hash &&
                      a->total_bytes == b->total_bytes && a->index_xxh3 == b->index_xxh3;
    if (!same || !verify(theirs).ok()) continue;
    return Elsewhere{theirs, step};
  }
  return std::nullopt;
}

absl::StatusOr<std::set<int64_t>> RestoreTiers::AllSteps(const std::string& job_dir,
                                                         const std::string& upload_dir,
                                                         storage::Storage* fs, Steps which) {
  auto list = [which, fs](const std::string& dir) {
    return which == Steps::kAll ? checkpoint::ListCommittedSteps(dir, fs)
                                : checkpoint::CommittedOnTimeline(dir, fs);
  };
  std::set<int64_t> steps;
  auto committed = list(job_dir);
  if (!committed.ok() && !absl::IsNotFound(committed.status())) return committed.status();
  if (committed.ok()) steps.insert(committed->begin(), committed->end());
  if (!upload_dir.empty()) {
    // The store's steps restore too (a restore reads there what is not here).
    auto stored = list(upload_dir);
    if (stored.ok()) steps.insert(stored->begin(), stored->end());
  }
  return steps;
}

}  // namespace zcc::daemon
