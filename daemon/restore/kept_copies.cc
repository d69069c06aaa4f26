#include "daemon/restore/kept_copies.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/log.h"
#include "format/manifest.h"
#include "storage/whole_file.h"

namespace zcc::daemon {

void KeptCopies::Watch(const std::string& upload_dir, const std::string& job_dir) {
  std::string dir(absl::StripSuffix(upload_dir, "/"));
  zcc::MutexLock lock(&mu_);
  watched_[std::move(dir)] = job_dir;
}

bool KeptCopies::Served(const std::string& step_dir) const {
  zcc::MutexLock lock(&mu_);
  if (forgotten_.count(step_dir) > 0) return true;
  return std::find(served_.begin(), served_.end(), step_dir) != served_.end();
}

void KeptCopies::Forget(const std::string& step_dir) {
  std::string kept_dir;
  {
    zcc::MutexLock lock(&mu_);
    // Until it is removed, never read again (a copy kept anew is newer than
    // the removal).
    forgotten_[step_dir] = absl::InfiniteFuture();
    found_.erase(step_dir);
    // (Served while forgotten; a copy kept anew is served afresh.)
    served_.erase(std::remove(served_.begin(), served_.end(), step_dir), served_.end());
    kept_dir = KeptDirFor(step_dir);
  }
  if (kept_dir.empty()) return;
  const absl::Status removed = base()->RemoveTree(kept_dir);
  if (!removed.ok()) {
    // Partly removed, perhaps: what is left is never read again.
    ZCC_LOG(WARNING) << "could not remove the damaged kept copy " << kept_dir << ": " << removed;
    return;
  }
  zcc::MutexLock lock(&mu_);
  if (auto it = forgotten_.find(step_dir); it != forgotten_.end()) it->second = absl::Now();
}

std::string KeptCopies::KeptDirFor(const std::string& step_dir) const {
  const size_t slash = step_dir.rfind('/');
  if (slash == std::string::npos) return "";
  auto it = watched_.find(step_dir.substr(0, slash));
  if (it == watched_.end()) return "";
  const absl::StatusOr<int64_t> step = format::ParseStepDirName(step_dir.substr(slash + 1));
  if (!step.ok()) return "";
  return JoinPath(it->second, format::SentStepDirName(*step));
}

bool KeptCopies::KeptSince(const std::string& kept_dir, absl::Time when) {
  absl::StatusOr<storage::FileInfo> info = base()->Stat(kept_dir);
  return info.ok() && info->is_dir && info->modified > when;
}

std::map<std::string, std::string> KeptCopies::Match(const std::string& step_dir,
                                                     const std::string& kept_dir) {
  std::map<std::string, std::string> files;
  absl::StatusOr<std::vector<std::string>> names = base()->List(kept_dir);
  if (!names.ok()) {
    // NotFound: nothing kept for this step. Anything else (permissions) is
    // said: the store is read instead, which is right, but slower.
    if (!absl::IsNotFound(names.status())) {
      ZCC_LOG(WARNING) << "the kept copy " << kept_dir << " cannot be listed (" << names.status()
                       << "); " << step_dir << " is read from the store";
    }
    return files;
  }
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".manifest.json")) continue;
    // The rank's files are the store's only if its manifest is: the same
    // run, the same tensors, the same checksums.
    auto kept = storage::ReadWholeFile(*base(), JoinPath(kept_dir, name), format::kMaxManifestBytes);
    if (!kept.ok()) {
      ZCC_LOG(WARNING) << "the kept copy's " << JoinPath(kept_dir, name) << " cannot be read ("
                       << kept.status() << "); its rank's files are read from the store";
      continue;
    }
    auto stored =
        storage::ReadWholeFile(*base(), JoinPath(step_dir, name), format::kMaxManifestBytes);
    if (!stored.ok() || *stored != *kept) continue;
    absl::StatusOr<format::RankManifest> manifest = format::DecodeRankManifest(*kept);
    if (!manifest.ok()) {  // equal to the store's: the store's is as bad; the restore says so
      continue;
    }
    std::map<std::string, std::string> rank_files;
    bool whole = true;
    for (const format::ManifestFile& f : manifest->files) {
      const std::string path = JoinPath(kept_dir, f.name);
      absl::StatusOr<storage::FileInfo> info = base()->Stat(path);
      if (!info.ok() || info->is_dir || info->size != f.bytes) {
        whole = false;
        break;
      }
      rank_files.emplace(f.name, path);
    }
    if (whole) files.insert(rank_files.begin(), rank_files.end());
  }
  if (!files.empty()) {
    ZCC_LOG(INFO) << "reading " << files.size() << " file(s) of " << step_dir
                  << " from this node's kept copy " << kept_dir;
  }
  return files;
}

absl::StatusOr<std::unique_ptr<storage::File>> KeptCopies::OpenForRead(
    const std::string& path, const storage::OpenOptions& options) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return base()->OpenForRead(path, options);
  const std::string step_dir = path.substr(0, slash);
  const std::string name = path.substr(slash + 1);
  const absl::Time now = absl::Now();
  std::string local;
  std::string kept_dir;  // to look at (nothing known of the step yet)
  std::optional<absl::Time> forgotten;
  {
    zcc::MutexLock lock(&mu_);
    if (auto it = forgotten_.find(step_dir); it != forgotten_.end()) {
      forgotten = it->second;
      kept_dir = KeptDirFor(step_dir);
    }
  }
  if (forgotten.has_value() && !kept_dir.empty() && KeptSince(kept_dir, *forgotten)) {
    zcc::MutexLock lock(&mu_);
    if (auto it = forgotten_.find(step_dir); it != forgotten_.end() && it->second == *forgotten) {
      forgotten_.erase(it);
    }
  }
  kept_dir.clear();
  {
    zcc::MutexLock lock(&mu_);
    if (watched_.empty() || forgotten_.count(step_dir) > 0) {
      // (Most reads: a job without a kept copy.)
    } else if (auto it = found_.find(step_dir);
               it != found_.end() && now - it->second.when < remember_) {
      if (auto f = it->second.files.find(name); f != it->second.files.end()) local = f->second;
    } else {
      kept_dir = KeptDirFor(step_dir);
    }
  }
  if (!kept_dir.empty()) {
    std::map<std::string, std::string> files = Match(step_dir, kept_dir);
    if (auto f = files.find(name); f != files.end()) local = f->second;
    zcc::MutexLock lock(&mu_);
    for (auto it = found_.begin(); it != found_.end();) {
      it = now - it->second.when >= remember_ ? found_.erase(it) : std::next(it);
    }
    if (forgotten_.count(step_dir) == 0) found_[step_dir] = Found{std::move(files), now};
  }
  if (!local.empty()) {
    absl::StatusOr<std::unique_ptr<storage::File>> file = base()->OpenForRead(local, options);
    zcc::MutexLock lock(&mu_);
    auto it = found_.find(step_dir);
    if (file.ok()) {
      if (std::find(served_.begin(), served_.end(), step_dir) == served_.end()) {
        served_.push_back(step_dir);
        if (served_.size() > kServedKept) served_.pop_front();
      }
      return file;
    }
    // Gone since it was found (a newer step sent): the store's, from now on.
    if (it != found_.end()) found_.erase(it);
  }
  return base()->OpenForRead(path, options);
}

}  // namespace zcc::daemon
