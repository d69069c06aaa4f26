#include "daemon/peer/recovered_steps.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "format/manifest.h"

namespace zcc::daemon::peer {

void RecoveredSteps::Add(std::shared_ptr<RecoveredStep> step) {
  zcc::MutexLock lock(&mu_);
  by_job_dir_[step->job_dir()] = std::move(step);
}

void RecoveredSteps::Remove(const RecoveredStep* step) {
  zcc::MutexLock lock(&mu_);
  auto it = by_job_dir_.find(step->job_dir());
  if (it != by_job_dir_.end() && it->second.get() == step) by_job_dir_.erase(it);
}

std::shared_ptr<RecoveredStep> RecoveredSteps::Find(const std::string& job_dir) const {
  zcc::MutexLock lock(&mu_);
  auto it = by_job_dir_.find(job_dir);
  return it == by_job_dir_.end() ? nullptr : it->second;
}

void RecoveredSteps::CancelAll() {
  zcc::MutexLock lock(&mu_);
  for (auto& [dir, step] : by_job_dir_) step->Cancel();
}

std::shared_ptr<RecoveredStep> RecoveredSteps::Serving(const std::string& path) {
  std::shared_ptr<RecoveredStep> step;
  bool latest = false;
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [job_dir, shown] : by_job_dir_) {
      if (path == shown->dir() || absl::StartsWith(path, shown->dir() + "/")) return shown;
      if (path == JoinPath(job_dir, format::kLatestFileName)) {
        step = shown;
        latest = true;
        break;
      }
    }
  }
  if (!latest) return nullptr;
  // `latest` of the disk, where it names the step or a newer one (the job
  // went on and committed again meanwhile).
  auto on_disk = checkpoint::ReadLatest(step->job_dir(), base());
  return on_disk.ok() && *on_disk >= step->step() ? nullptr : step;
}

absl::StatusOr<std::unique_ptr<storage::File>> RecoveredSteps::OpenForRead(
    const std::string& path, const storage::OpenOptions& options) {
  if (std::shared_ptr<RecoveredStep> step = Serving(path)) return step->OpenForRead(path, options);
  return base()->OpenForRead(path, options);
}

absl::StatusOr<storage::FileInfo> RecoveredSteps::Stat(const std::string& path) {
  if (std::shared_ptr<RecoveredStep> step = Serving(path)) return step->Stat(path);
  auto info = base()->Stat(path);
  if (absl::IsNotFound(info.status()) && Find(path) != nullptr) {
    storage::FileInfo dir;  // a job directory the disk lacks (a replacement node's)
    dir.is_dir = true;
    return dir;
  }
  return info;
}

absl::StatusOr<std::vector<std::string>> RecoveredSteps::List(const std::string& path) {
  if (std::shared_ptr<RecoveredStep> step = Serving(path)) return step->List(path);
  auto names = base()->List(path);
  std::shared_ptr<RecoveredStep> step = Find(path);
  if (step == nullptr) return names;
  if (!names.ok() && !absl::IsNotFound(names.status())) return names;
  std::vector<std::string> out = names.ok() ? *std::move(names) : std::vector<std::string>();
  const std::string name = format::StepDirName(step->step());
  if (std::find(out.begin(), out.end(), name) == out.end()) {
    out.push_back(name);
    std::sort(out.begin(), out.end());
  }
  return out;
}

}  // namespace zcc::daemon::peer
