#include "daemon/control/relayout.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "common/file_util.h"
#include "common/fs_identity.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/restore/restore_tiers.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {
namespace {

// The newest step every rank of `world` holds in `retained`, with each
// rank's slot of it in `slots`; nullopt (with the reason in `why`) when a
// rank holds nothing or they share no step.
std::optional<int64_t> NewestCommonStep(
    const std::map<uint32_t, RetainedSnapshots::Entry>& retained, uint32_t world,
    std::map<uint32_t, SlotSnapshot>* slots, std::string* why) {
  std::optional<std::set<int64_t>> common;
  for (uint32_t rank = 0; rank < world; ++rank) {
    auto it = retained.find(rank);
    if (it == retained.end()) {
      *why = absl::StrCat("rank ", rank, " of ", world, " left no snapshot in this zccd's memory");
      return std::nullopt;
    }
    std::set<int64_t> steps;
    for (const SlotSnapshot& s : it->second.snapshots) steps.insert(s.step);
    if (common.has_value()) {
      std::set<int64_t> both;
      for (int64_t s : steps) {
        if (common->count(s) > 0) both.insert(s);
      }
      common = std::move(both);
    } else {
      common = std::move(steps);
    }
  }
  if (!common.has_value() || common->empty()) {
    *why = "its ranks hold no step in common";
    return std::nullopt;
  }
  const int64_t step = *common->rbegin();
  for (const auto& [rank, entry] : retained) {
    for (const SlotSnapshot& s : entry.snapshots) {
      if (s.step == step) (*slots)[rank] = s;
    }
  }
  return step;
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> PersistRetainedStep(const PreviousLayout& previous,
                                                           storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  const JobOptions& o = previous.options;
  const std::map<uint32_t, RetainedSnapshots::Entry>& retained = previous.retained;
  std::map<uint32_t, SlotSnapshot> slots;
  std::string why;
  const std::optional<int64_t> newest = NewestCommonStep(retained, o.world_size, &slots, &why);
  if (!newest.has_value()) {
    ZCC_LOG(INFO) << "job " << o.job_id << ": the snapshots its previous layout (world_size "
                  << o.world_size << ") left in memory are not written for the new one: " << why;
    return std::optional<int64_t>();
  }
  const int64_t step = *newest;
  ScopedFsIdentity as_owner(o.owner);
  ZCC_ASSIGN_OR_RETURN(std::set<int64_t> on_disk,
                       RestoreTiers::AllSteps(o.job_dir, o.upload_dir, &fs));
  if (!on_disk.empty() && *on_disk.rbegin() >= step) {
    ZCC_LOG(INFO) << "job " << o.job_id << ": the newest step its previous layout left in memory, "
                  << step << ", is no newer than step " << *on_disk.rbegin() << " in "
                  << o.job_dir;
    return std::optional<int64_t>();
  }
  ZCC_LOG(INFO) << "job " << o.job_id << ": resumed in another layout; writing step " << step
                << " from the memory of its previous layout (world_size " << o.world_size
                << ") into " << o.job_dir << " so that the new layout restores it";
  const absl::Time began = absl::Now();
  const std::string dir = JoinPath(o.job_dir, format::PartialStepDirName(step));
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(dir));
  uint64_t bytes = 0;
  // The EMA goes with the step only when no rank's has folded in a later
  // step (one rank's missing would leave the step's EMA incomplete, which a
  // restore skips anyway): said here rather than left to be found. One of
  // an earlier step (between EMA updates) is written as of that step.
  bool with_ema = true;
  for (const auto& [rank, held] : slots) {
    const std::optional<int64_t> ema = retained.at(rank).session->ema_step();
    if (ema.has_value() && *ema > step) {
      ZCC_LOG(WARNING) << "job " << o.job_id << ": step " << step
                       << " is written without the EMA: rank " << rank << "'s is of step "
                       << *ema << "; the new layout's EMA starts afresh";
      with_ema = false;
      break;
    }
  }
  absl::Status st = [&]() -> absl::Status {
    for (const auto& [rank, held] : slots) {
      // As each rank's checkpoint writes go: from its slot, at the disk's speed.
      ZCC_ASSIGN_OR_RETURN(checkpoint::WriteStats written,
                           retained.at(rank).session->WriteRetained(held, o.job_dir, with_ema));
      bytes += written.bytes;
    }
    ZCC_ASSIGN_OR_RETURN(checkpoint::CommitResult result,
                         checkpoint::TryCommit(o.job_dir, o.job_id, step, o.world_size, &fs));
    if (result.outcome != checkpoint::CommitOutcome::kCommitted) {
      return absl::DataLossError(absl::StrCat("step ", step,
                                              " written from memory did not commit (",
                                              result.manifests_present, " of ", o.world_size,
                                              " ranks' manifests)"));
    }
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    // Nothing of it stays for a later write of that step to mix with.
    if (absl::Status removed = fs.RemoveTree(dir); !removed.ok()) {
      ZCC_LOG(WARNING) << "job " << o.job_id << ": " << dir << " is left behind: " << removed;
    }
    return st;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - began);
  ZCC_LOG(INFO) << "job " << o.job_id << ": step " << step << " (" << bytes
                << " bytes) written from memory and committed in " << seconds << " s ("
                << (seconds > 0 ? bytes / seconds / 1e9 : 0) << " GB/s)";
  return std::optional<int64_t>(step);
}

}  // namespace zcc::daemon
