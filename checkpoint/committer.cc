#include "checkpoint/committer.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

absl::Status CheckFileSize(storage::Storage& fs, const std::string& path, uint64_t expected) {
  ZCC_ASSIGN_OR_RETURN(const storage::FileInfo info, fs.Stat(path));
  if (info.is_dir || info.size != expected) {
    return absl::DataLossError(absl::StrCat(path, " is ", info.size, " bytes; its manifest says ",
                                            expected));
  }
  return absl::OkStatus();
}

// Replaces committed step directory `final_dir` with `partial` (a step
// committed again: training resumed from an older step). The exchange keeps
// step-N committed, old or new, at every moment; the old contents end up
// under the partial name, are moved at once to step-N.superseded (a later
// write of the step must never find the old manifests and COMMITTED in its
// step-N.partial/; recovery removes them there too, RecoverJobDir) and
// removed. The step is committed once the exchange is durable: what fails
// after that is left to retention as debris, with a warning.
absl::Status ReplaceStep(storage::Storage& fs, const std::string& job_dir,
                         const std::string& partial, const std::string& final_dir) {
  const std::string superseded = absl::StrCat(final_dir, ".superseded");
  const absl::Status exchanged = fs.Exchange(partial, final_dir);
  if (exchanged.ok()) {
    // The exchange durable before `latest` can name the step (a failure
    // here fails the commit; the replaced contents left under the partial's
    // name are never committed again: TryCommit, ForgetReplacedStep).
    ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
    const absl::Status moved = [&]() -> absl::Status {
      ZCC_RETURN_IF_ERROR(fs.RemoveTree(superseded));
      ZCC_RETURN_IF_ERROR(fs.Rename(partial, superseded));
      ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
      return fs.RemoveTree(superseded);
    }();
    if (!moved.ok()) {
      ZCC_LOG(WARNING) << final_dir << " is committed anew, but the contents it replaced could "
                       << "not be removed (" << moved << "); they are removed before step-N is "
                       << "written or committed again, and by recovery";
    }
    return absl::OkStatus();
  }
  if (!absl::IsUnimplemented(exchanged)) return exchanged;
  // File systems without the exchange (NFS): two renames, with a short window
  // in which step-N is absent and restore falls back to older steps (zccd
  // killed in it leaves step-N absent: its contents, old and new, are in
  // step-N.superseded/ and step-N.partial/ until retention removes them).
  ZCC_LOG(WARNING) << exchanged.message() << "; replacing " << final_dir << " with two renames";
  ZCC_RETURN_IF_ERROR(fs.RemoveTree(superseded));
  ZCC_RETURN_IF_ERROR(fs.Rename(final_dir, superseded));
  if (absl::Status placed = fs.Rename(partial, final_dir); !placed.ok()) {
    // The step as it was goes back: committed at every moment but this one.
    const absl::Status back = fs.Rename(superseded, final_dir);
    if (!back.ok()) {
      ZCC_LOG(ERROR) << final_dir << " could not be replaced (" << placed << ") nor put back ("
                     << back << "); its contents are in " << superseded;
    }
    return placed;
  }
  ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
  return fs.RemoveTree(superseded);
}

// A commit that renamed step-N/ into place but failed to write `latest`
// (EIO, ENOSPC) left step-N/ committed and `latest` older. When the commit of
// step N is tried again, its partial is gone: this finishes that commit by
// writing `latest`, if step-N/ holds this job's COMMITTED for `world_size`
// ranks and `latest` names an older step (or none), written before step N's
// commit. Anything else (a step that was never renamed, `latest` already at
// or past N, or pointed back to an older step since N's commit) is left
// alone and answers nullopt.
absl::StatusOr<std::optional<CommitResult>> FinishRenamedStep(storage::Storage& fs,
                                                              const std::string& job_dir,
                                                              const std::string& job_id,
                                                              int64_t step, uint32_t world_size) {
  const std::string final_dir = JoinPath(job_dir, format::StepDirName(step));
  if (!storage::Exists(fs, JoinPath(final_dir, format::kCommittedFileName))) return std::nullopt;
  auto record = ReadCommitRecord(final_dir, &fs);
  if (!record.ok() || record->job_id != job_id || record->step != step ||
      record->world_size != world_size) {
    return std::nullopt;
  }
  auto latest = ReadLatest(job_dir, &fs);
  if (latest.ok() && *latest >= step) return std::nullopt;
  if (!latest.ok() && !absl::IsNotFound(latest.status()) && !absl::IsDataLoss(latest.status())) {
    return latest.status();
  }
  // Only a write of `latest` lost after this step's rename is made up for.
  // A `latest` written since the step's COMMITTED (training went on from an
  // older step and pointed it back there) is left alone: this step is of
  // the run left behind. (Both times from the storage's clock.)
  if (latest.ok()) {
    auto committed = fs.Stat(JoinPath(final_dir, format::kCommittedFileName));
    auto named = fs.Stat(JoinPath(job_dir, format::kLatestFileName));
    if (!committed.ok()) return committed.status();
    if (!named.ok()) return named.status();
    // (Equal times, on storage with whole-second ones: not told apart, so
    // not finished; the step stays above `latest`, kept, until passed.)
    if (named->modified >= committed->modified) return std::nullopt;
  }
  ZCC_LOG(WARNING) << final_dir << " is committed but latest names "
                   << (latest.ok() ? format::StepDirName(*latest) : std::string("no step"))
                   << " (an earlier attempt failed after the rename); finishing the commit";
  // Forward only (latest is older here); a compare-and-swap on a store.
  ZCC_RETURN_IF_ERROR(PointLatest(fs, job_dir, step, absl::InfiniteFuture()));
  CommitResult result;
  result.outcome = CommitOutcome::kCommitted;
  result.manifests_present = world_size;
  result.total_bytes = record->total_bytes;
  return result;
}

// Whether the commit of the step `latest` names (`newer`, past the step
// being committed) happened after `write_began`: then the commit now
// finishing is late and leaves `latest` alone. A newer step committed
// before (a timeline abandoned when training resumed from an older step) is
// superseded. COMMITTED's time has whole seconds: within a second of
// `write_began` it counts as after (never moving `latest` back wrongly).
bool CommittedAfter(storage::Storage& fs, const std::string& job_dir, int64_t newer,
                    absl::Time write_began) {
  if (write_began == absl::InfiniteFuture()) return false;
  auto record = ReadCommitRecord(JoinPath(job_dir, format::StepDirName(newer)), &fs);
  if (!record.ok()) return false;  // not a committed step: nothing to keep
  absl::Time at;
  std::string error;
  if (!absl::ParseTime("%Y-%m-%dT%H:%M:%SZ", record->committed_at, &at, &error)) return true;
  return at + absl::Seconds(1) > write_began;
}

}  // namespace

absl::Status PointLatest(storage::Storage& fs, const std::string& job_dir, int64_t step,
                         absl::Time write_began) {
  const std::string path = JoinPath(job_dir, format::kLatestFileName);
  const std::string content = absl::StrCat(format::StepDirName(step), "\n");
  for (int attempt = 0;; ++attempt) {
    auto current = fs.ReadVersioned(path, 4096);
    if (absl::IsUnimplemented(current.status())) {
      return storage::WriteFileAtomic(fs, path, content);
    }
    if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
    if (current.ok()) {
      auto named = format::ParseStepDirName(absl::StripAsciiWhitespace(current->content));
      if (named.ok() && *named == step) return absl::OkStatus();
      if (named.ok() && *named > step && CommittedAfter(fs, job_dir, *named, write_began)) {
        ZCC_LOG(WARNING) << path << " names " << format::StepDirName(*named)
                         << ", committed after " << format::StepDirName(step)
                         << " began to be written: this late commit leaves it there";
        return absl::OkStatus();
      }
    }
    const absl::Status written = fs.WriteIfVersion(path, content, current.ok() ? current->version : "");
    if (!absl::IsFailedPrecondition(written)) return written;
    if (attempt >= 16) {
      return absl::AbortedError(absl::StrCat(path, " kept changing under the commit of step ",
                                             step, "; giving up after ", attempt + 1, " tries"));
    }
    // Another commit wrote it first: decide again on what it wrote.
  }
}


absl::StatusOr<LatestBack> PointLatestBack(storage::Storage& fs, const std::string& job_dir,
                                           int64_t restored, std::optional<int64_t> only_from,
                                           absl::Time not_after) {
  const std::string path = JoinPath(job_dir, format::kLatestFileName);
  for (int attempt = 0;; ++attempt) {
    LatestBack back;
    auto current = fs.ReadVersioned(path, 4096);
    const bool versioned = !absl::IsUnimplemented(current.status());
    std::string content;
    if (versioned) {
      if (absl::IsNotFound(current.status())) return back;
      if (!current.ok()) return current.status();
      content = current->content;
    } else {
      auto text = storage::ReadWholeFile(fs, path, 4096);
      if (absl::IsNotFound(text.status())) return back;
      if (!text.ok()) return text.status();
      content = *std::move(text);
    }
    auto named = format::ParseStepDirName(absl::StripAsciiWhitespace(content));
    if (!named.ok()) {
      return absl::DataLossError(absl::StrCat(path, " does not name a step directory"));
    }
    back.named = *named;
    if (*named <= restored || (only_from.has_value() && *named != *only_from)) return back;
    // Committed at or after `not_after` (whole seconds: within one before,
    // too), it is not what was left behind.
    if (CommittedAfter(fs, job_dir, *named, not_after)) return back;
    // Changed meanwhile (below): only from the step first named.
    only_from = *named;
    ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> committed, ListCommittedSteps(job_dir, &fs));
    for (int64_t step : committed) {
      if (step <= restored) back.back_to = step;
    }
    if (back.back_to < 0) {
      // Nothing of this directory is on the run's timeline yet: `latest`
      // names the step itself, so that no reader takes the run left behind
      // for the newest (the step came from another tier, or from memory).
      back.back_to = restored;
      back.committed = false;
    }
    const std::string to = absl::StrCat(format::StepDirName(back.back_to), "\n");
    if (!versioned) {
      ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, path, to));
      return back;
    }
    const absl::Status written = fs.WriteIfVersion(path, to, current->version);
    if (!absl::IsFailedPrecondition(written)) {
      ZCC_RETURN_IF_ERROR(written);
      return back;
    }
    if (attempt >= 16) {
      return absl::AbortedError(absl::StrCat(path, " kept changing; giving up after ",
                                             attempt + 1, " tries"));
    }
  }
}

namespace {

// Removes the manifests in `dir` last modified before `before` (by the
// storage's clock; at it too with `inclusive`); returns how many.
absl::StatusOr<uint32_t> RemoveManifestsBefore(storage::Storage& fs, const std::string& dir,
                                               absl::Time before, bool inclusive) {
  auto files = fs.List(dir);
  if (absl::IsNotFound(files.status())) return 0;
  if (!files.ok()) return files.status();
  uint32_t removed = 0;
  for (const std::string& file : *files) {
    if (!absl::EndsWith(file, ".manifest.json")) continue;
    const std::string path = JoinPath(dir, file);
    auto info = fs.Stat(path);
    if (absl::IsNotFound(info.status())) continue;
    if (!info.ok()) return info.status();
    if (inclusive ? info->modified > before : info->modified >= before) continue;
    const absl::Status st = fs.Remove(path);
    if (absl::IsNotFound(st)) continue;
    if (!st.ok()) return st;
    ++removed;
  }
  return removed;
}

}  // namespace

absl::StatusOr<uint32_t> ForgetReplacedStep(storage::Storage& fs, const std::string& job_dir,
                                            int64_t step) {
  const std::string dir = JoinPath(job_dir, format::PartialStepDirName(step));
  const std::string committed = JoinPath(dir, format::kCommittedFileName);
  ZCC_ASSIGN_OR_RETURN(const storage::FileInfo replaced, fs.Stat(committed));
  // COMMITTED first: without it the rest is an ordinary partial, whose old
  // manifests (no newer than it; one written since is this run's) go next.
  ZCC_RETURN_IF_ERROR(fs.Remove(committed));
  ZCC_ASSIGN_OR_RETURN(const uint32_t removed,
                       RemoveManifestsBefore(fs, dir, replaced.modified, /*inclusive=*/true));
  ZCC_RETURN_IF_ERROR(fs.SyncDir(dir));
  return removed;
}

absl::StatusOr<uint32_t> ForgetLeftBehindParts(storage::Storage& fs, const std::string& job_dir,
                                               int64_t restored, absl::Time at) {
  if (CommitsInPlace(fs, job_dir)) return 0;
  auto names = fs.List(job_dir);
  if (absl::IsNotFound(names.status())) return 0;
  if (!names.ok()) return names.status();
  uint32_t removed = 0;
  for (const std::string& name : *names) {
    absl::string_view base = name;
    if (!absl::ConsumeSuffix(&base, ".partial")) continue;
    auto step = format::ParseStepDirName(base);
    if (!step.ok() || *step <= restored) continue;
    const std::string dir = JoinPath(job_dir, name);
    uint32_t forgot = 0;
    if (HoldsReplacedStep(fs, job_dir, *step)) {
      // (The contents an earlier commit of the step replaced.)
      ZCC_ASSIGN_OR_RETURN(forgot, ForgetReplacedStep(fs, job_dir, *step));
    } else if (!storage::Exists(fs, JoinPath(dir, format::kCommittedFileName))) {
      ZCC_ASSIGN_OR_RETURN(forgot, RemoveManifestsBefore(fs, dir, at, /*inclusive=*/false));
    }
    removed += forgot;
  }
  return removed;
}

absl::StatusOr<CommitResult> TryCommit(const std::string& job_dir, const std::string& job_id,
                                       int64_t step, uint32_t world_size,
                                       storage::Storage* storage, absl::Time write_began,
                                       const std::string& written_in) {
  // Everything the commit reads and changes goes through `storage`.
  storage::Storage& fs = storage::StorageOrDefault(storage);
  const bool in_place = CommitsInPlace(fs, job_dir);
  // step-N.partial/ (or `written_in`), or step-N/ itself where steps commit
  // in place.
  const std::string partial =
      !in_place && !written_in.empty() ? written_in : WritingStepDir(fs, job_dir, step);
  if (!in_place && written_in.empty() && HoldsReplacedStep(fs, job_dir, step)) {
    // What an earlier commit of the step replaced, its move away cut short:
    // all its manifests are there, and would put it back in place.
    ZCC_LOG(WARNING) << partial << " holds the contents an earlier commit of step " << step
                     << " replaced; removing their COMMITTED and manifests";
    ZCC_RETURN_IF_ERROR(ForgetReplacedStep(fs, job_dir, step).status());
  }
  CommitResult result;
  for (uint32_t r = 0; r < world_size; ++r) {
    if (storage::Exists(fs, JoinPath(partial, format::ManifestFileName(r)))) {
      ++result.manifests_present;
    }
  }
  if (result.manifests_present == 0 && (in_place || !storage::Exists(fs, partial))) {
    ZCC_ASSIGN_OR_RETURN(std::optional<CommitResult> finished,
                         FinishRenamedStep(fs, job_dir, job_id, step, world_size));
    if (finished.has_value()) return *finished;
  }
  if (result.manifests_present < world_size) return result;

  std::vector<format::RankManifest> manifests;
  absl::flat_hash_set<std::string> files;
  format::Xxh3Stream combined;
  for (uint32_t r = 0; r < world_size; ++r) {
    const std::string path = JoinPath(partial, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text,
                         storage::ReadWholeFile(fs, path, format::kMaxManifestBytes));
    auto decoded = format::DecodeRankManifest(text);
    if (!decoded.ok()) return Annotate(decoded.status(), path);
    const format::RankManifest& m = *decoded;
    if (m.job_id != job_id || m.step != step || m.rank != r || m.world_size != world_size) {
      return absl::DataLossError(absl::StrCat(
          path, " belongs to job '", m.job_id, "' step ", m.step, " rank ", m.rank, " of ",
          m.world_size, "; expected job '", job_id, "' step ", step, " rank ", r, " of ",
          world_size));
    }
    for (const format::ManifestFile& f : m.files) {
      if (!files.insert(f.name).second) {
        return absl::DataLossError(
            absl::StrCat(path, " lists '", f.name, "', which another rank's manifest lists"));
      }
      ZCC_RETURN_IF_ERROR(CheckFileSize(fs, JoinPath(partial, f.name), f.bytes));
      result.total_bytes += f.bytes;
    }
    combined.Update(text.data(), text.size());
    manifests.push_back(*std::move(decoded));
  }
  // One run's manifests only, of one timeline of it: another's is left from
  // before this step was written again (by a new run, or by the run going on
  // from an older step), and is replaced when its rank writes the step.
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> lines;
  for (const format::RankManifest& m : manifests) lines[{m.run_id, m.timeline}].push_back(m.rank);
  if (lines.size() > 1) {
    result.mixed_runs = true;
    result.total_bytes = 0;
    std::vector<std::string> parts;
    for (const auto& [line, ranks] : lines) {
      parts.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                                   absl::StrJoin(ranks, ","), ": run '", line.first,
                                   "' timeline '", line.second, "'"));
    }
    result.mixed = absl::StrJoin(parts, "; ");
    return result;
  }

  // Layout-free: the pieces of every global tensor must tile it exactly once
  // (a piece written twice, or by no rank, or ranks that disagree on a
  // tensor's shape or dtype, leave the step uncommitted).
  // Replicas agree: the members of each replica group registered the same
  // replicated tensors (one of them wrote each).
  ZCC_RETURN_IF_ERROR(CheckReplicaGroups(manifests));
  format::CommitRecord record;
  if (!manifests.empty()) {  // (every rank's the same, as checked above)
    record.run_id = manifests.front().run_id;
    record.timeline = manifests.front().timeline;
  }
  const format::StepIndex index = BuildStepIndex(std::move(manifests));
  std::vector<std::string> incomplete_ema;
  ZCC_ASSIGN_OR_RETURN(const std::vector<GlobalTensor> tensors,
                       GroupPieces(index, &incomplete_ema));
  for (const std::string& why : incomplete_ema) {
    ZCC_LOG(WARNING) << "job " << job_id << " step " << step
                     << ": the EMA of a tensor is incomplete and is left out of the step (" << why
                     << ")";
  }
  const std::string index_text = format::EncodeStepIndex(index);
  if (index_text.size() > format::MaxStepIndexBytes(world_size)) {  // readers would refuse it
    return absl::InternalError(absl::StrCat("the step index is ", index_text.size(),
                                            " bytes; readers accept ",
                                            format::MaxStepIndexBytes(world_size)));
  }
  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(partial, format::kStepIndexFileName), index_text));
  // The Hugging Face weight maps name whole tensors only: a piece of a
  // sliced tensor is not the tensor (zccctl export writes whole ones).
  std::map<std::string, std::string> model_map;
  std::map<std::string, std::string> ema_map;
  for (const GlobalTensor& g : tensors) {
    if (g.pieces.size() != 1 || g.pieces.front()->shape != g.global_shape) continue;
    if (g.kind == format::TensorKindName(format::TensorKind::kParam)) {
      model_map[g.name] = g.pieces.front()->file;
    }
    if (g.kind == format::kEmaKindName) ema_map[g.name] = g.pieces.front()->file;
  }

  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(partial, format::kModelIndexFileName),
                               format::EncodeWeightMapIndex(model_map, result.total_bytes)));
  if (!ema_map.empty()) {
    ZCC_RETURN_IF_ERROR(
        storage::WriteFileAtomic(fs, JoinPath(partial, format::kEmaIndexFileName),
                                 format::EncodeWeightMapIndex(ema_map, result.total_bytes)));
  }
  record.job_id = job_id;
  record.step = step;
  record.world_size = world_size;
  record.manifest_hash = combined.Digest();
  record.total_bytes = result.total_bytes;
  record.index_xxh3 = format::Xxh3(index_text.data(), index_text.size());
  record.committed_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  // WriteFileAtomic syncs the file and the partial directory.
  ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, JoinPath(partial, format::kCommittedFileName),
                                               format::EncodeCommitRecord(record)));

  const std::string final_dir = JoinPath(job_dir, format::StepDirName(step));
  if (in_place) {
    // COMMITTED, written last and whole, was the commit.
  } else if (storage::Exists(fs, final_dir)) {
    ZCC_RETURN_IF_ERROR(ReplaceStep(fs, job_dir, partial, final_dir));
  } else {
    ZCC_RETURN_IF_ERROR(fs.Rename(partial, final_dir));
    ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
  }
  ZCC_RETURN_IF_ERROR(PointLatest(fs, job_dir, step, write_began));
  result.outcome = CommitOutcome::kCommitted;
  return result;
}

}  // namespace zcc::checkpoint
