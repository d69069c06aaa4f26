#include "daemon/peer/recovered_step.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/peer/memory_tier.h"
#include "daemon/peer/peer_client.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/completion_queue.h"
#include "storage/whole_file.h"

namespace zcc::daemon::peer {
namespace {

// Pulls in flight at once, over every file of the step (each a gRPC call
// of one request's bytes; the restore keeps several per file in flight).
constexpr int kPullThreads = 8;
constexpr uint32_t kMaxQueueDepth = 4;

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

std::string Base(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status ReadOnly(const std::string& path) {
  return absl::PermissionDeniedError(
      absl::StrCat(path, " is part of a step read from the peer tier; it is not written here"));
}

}  // namespace

// A shard file: each request pulled on the step's threads.
class RecoveredStep::PulledFile final : public storage::File {
 public:
  PulledFile(std::shared_ptr<RecoveredStep> step, std::string path, const Remote* remote,
             uint32_t queue_depth)
      : step_(std::move(step)),
        path_(std::move(path)),
        remote_(remote),
        queue_depth_(std::clamp<uint32_t>(queue_depth, 1, kMaxQueueDepth)) {
    step_->Opened();
  }
  ~PulledFile() override {
    (void)Close();
    step_->Closed();
  }

  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }
  uint32_t queue_depth() const override { return queue_depth_; }
  uint32_t in_flight() const override { return in_flight_; }

  absl::Status SubmitWrite(uint64_t, const void*, size_t, uint64_t) override {
    return ReadOnly(path_);
  }
  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) override {
    if (in_flight_ >= queue_depth_) {
      return absl::FailedPreconditionError(absl::StrCat(queue_depth_, " requests in flight"));
    }
    ++in_flight_;
    const uint64_t size = remote_->bytes;
    const size_t want =
        offset >= size ? 0 : static_cast<size_t>(std::min<uint64_t>(n, size - offset));
    if (want == 0) {
      done_.Push(storage::IoCompletion{tag, absl::OkStatus(), 0});
      return absl::OkStatus();
    }
    step_->pulls_.Post([this, offset, dst, want, tag] {
      const absl::Status st = step_->ReadRange(*remote_, offset, dst, want);
      done_.Push(storage::IoCompletion{tag, st, st.ok() ? want : 0});
    });
    return absl::OkStatus();
  }
  absl::StatusOr<storage::IoCompletion> WaitForCompletion() override {
    return done_.Wait(&in_flight_);
  }
  bool HasCompletion() const override { return done_.HasCompletion(); }
  absl::StatusOr<uint64_t> Size() override { return remote_->bytes; }
  absl::Status Truncate(uint64_t) override { return ReadOnly(path_); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override {
    while (in_flight_ > 0) (void)done_.Wait(&in_flight_);  // their buffers stay the caller's
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<RecoveredStep> step_;
  const std::string path_;
  const Remote* const remote_;  // the step's: lives as long as step_
  const uint32_t queue_depth_;
  storage::CompletionQueue done_;
  uint32_t in_flight_ = 0;
};

RecoveredStep::RecoveredStep(std::string job_dir, const RecoveryPlan& plan,
                             const RecoverySources& sources)
    : job_dir_(std::move(job_dir)),
      step_(plan.step),
      dir_(JoinPath(job_dir_, format::StepDirName(plan.step))),
      partial_dir_(JoinPath(job_dir_, format::PartialStepDirName(plan.step))),
      plan_(plan),
      sources_(sources),
      pulls_(kPullThreads) {
  zcc::MutexLock lock(&mu_);
  last_closed_ = absl::Now();
}

RecoveredStep::~RecoveredStep() = default;

void RecoveredStep::Cancel() {
  cancel_.CancelAll();
  zcc::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool RecoveredStep::LeaveBehind() {
  {
    zcc::MutexLock lock(&mu_);
    if (left_behind_) return false;
    left_behind_ = true;
    write_here_ = false;
  }
  cancel_.CancelAll();
  return true;
}

bool RecoveredStep::left_behind() const {
  zcc::MutexLock lock(&mu_);
  return left_behind_;
}

bool RecoveredStep::Touch(bool rank0) {
  zcc::MutexLock lock(&mu_);
  if (let_go_) return false;
  last_closed_ = absl::Now();
  write_here_ = write_here_ || rank0;
  return true;
}

void RecoveredStep::Opened() {
  zcc::MutexLock lock(&mu_);
  ++open_files_;
}

void RecoveredStep::Closed() {
  zcc::MutexLock lock(&mu_);
  --open_files_;
  last_closed_ = absl::Now();
}

RecoveredStep::AfterQuiet RecoveredStep::AwaitQuiet(absl::Duration quiet) {
  zcc::MutexLock lock(&mu_);
  auto none_open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return open_files_ == 0 || cancelled_;
  };
  auto reopened = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return open_files_ > 0 || cancelled_;
  };
  for (;;) {
    mu_.Await(absl::Condition(&none_open));
    if (cancelled_) return AfterQuiet::kCancelled;
    const absl::Duration left = last_closed_ + quiet - absl::Now();
    if (left <= absl::ZeroDuration()) {
      if (write_here_) return AfterQuiet::kWrite;
      let_go_ = true;
      return AfterQuiet::kLetGo;
    }
    // Woken early only by a file opened again (or the cancel).
    mu_.AwaitWithTimeout(absl::Condition(&reopened), left);
  }
}

absl::StatusOr<std::shared_ptr<RecoveredStep>> RecoveredStep::Make(const std::string& job_id,
                                                                   uint32_t uid,
                                                                   const std::string& job_dir,
                                                                   const RecoveryPlan& plan,
                                                                   const RecoverySources& sources) {
  std::shared_ptr<RecoveredStep> made(new RecoveredStep(job_dir, plan, sources));
  storage::Storage& small = made->small_;
  ZCC_RETURN_IF_ERROR(small.MakeDirs(made->partial_dir_));
  for (const auto& [rank, holders] : plan.ranks) {
    auto text = plan.manifests.find(rank);
    auto decoded = plan.decoded.find(rank);
    if (text == plan.manifests.end() || decoded == plan.decoded.end()) {
      return absl::DataLossError(absl::StrCat("rank ", rank, "'s manifest was not fetched"));
    }
    const format::RankManifest& manifest = decoded->second;
    const std::string manifest_name = format::ManifestFileName(rank);
    ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(
        small, JoinPath(made->partial_dir_, manifest_name), text->second));
    for (const format::ManifestFile& f : manifest.files) {
      Remote remote;
      remote.bytes = f.bytes;
      remote.key = ReplicaKey{job_id, uid, rank, plan.step, f.name};
      for (const auto& [holder, files] : holders) {
        if (files.count(f.name) != 0) remote.holders.push_back(holder);
      }
      if (remote.holders.empty()) {
        return absl::DataLossError(
            absl::StrCat(f.name, " of rank ", rank, " is held by no zccd of the job"));
      }
      if (f.name == manifest_name || Base(f.name) != f.name) {
        return absl::DataLossError(
            absl::StrCat("rank ", rank, "'s manifest names a shard file '", f.name, "'"));
      }
      made->remote_bytes_ += f.bytes;
      made->remote_.emplace(f.name, std::move(remote));
    }
  }
  // The commit every step goes through: the manifests agree, the pieces
  // tile their tensors, the files have their sizes; it writes the index,
  // the weight maps, COMMITTED and `latest` (here, in memory).
  ZCC_ASSIGN_OR_RETURN(checkpoint::CommitResult result,
                       checkpoint::TryCommit(job_dir, job_id, plan.step, plan.world, made.get()));
  if (result.outcome != checkpoint::CommitOutcome::kCommitted) {
    if (result.mixed_runs) {
      return absl::DataLossError(absl::StrCat("its ranks' manifests are of different runs or "
                                              "timelines (", result.mixed, ")"));
    }
    return absl::DataLossError(absl::StrCat("only ", result.manifests_present, " of ", plan.world,
                                            " ranks' manifests make the step"));
  }
  {
    zcc::MutexLock lock(&made->mu_);
    made->sealed_ = true;
  }
  return made;
}

const RecoveredStep::Remote* RecoveredStep::RemoteAt(const std::string& path) const {
  const std::string parent = Parent(path);
  if (parent != dir_ && parent != partial_dir_) return nullptr;
  auto it = remote_.find(Base(path));
  return it == remote_.end() ? nullptr : &it->second;
}

absl::Status RecoveredStep::ReadFrom(const std::string& holder, const Remote& file,
                                     uint64_t offset, void* dst, size_t n, bool check_held) {
  if (holder == kThisZccd) {
    ZCC_ASSIGN_OR_RETURN(std::shared_ptr<const Replica> held, sources_.own->Get(file.key));
    if (held->bytes.size() != file.bytes || n > file.bytes - offset) {
      return absl::DataLossError(absl::StrCat("this zccd holds ", held->bytes.size(),
                                              " bytes of it; the manifest says ", file.bytes));
    }
    if (check_held && format::Xxh3(held->bytes.data(), held->bytes.size()) != held->info.xxh3) {
      return absl::DataLossError("this zccd's copy no longer matches its checksum");
    }
    std::memcpy(dst, held->bytes.data() + offset, n);
    return absl::OkStatus();
  }
  if (sources_.directory == nullptr) return absl::UnavailableError("no peer directory");
  // A range is a few MB: a stuck call ends long before the whole piece's
  // timeout would (keepalive finds a dead link within about 15 s anyway).
  const absl::Duration timeout =
      std::min(sources_.timeout, absl::Seconds(30) + absl::Seconds(static_cast<double>(n) / 1e6));
  const int connection = static_cast<int>(pulls_made_.fetch_add(1) % kPullThreads);
  return sources_.directory->Client(holder, connection)
      ->PullRange(file.key, file.bytes, offset, dst, n, check_held, timeout, &cancel_);
}

absl::Status RecoveredStep::ReadRange(const Remote& file, uint64_t offset, void* dst, size_t n) {
  absl::Status last = absl::DataLossError("every holder's copy is damaged");
  for (const std::string& holder : file.holders) {
    const auto id = std::make_pair(file.key.piece, holder);
    bool check;
    {
      zcc::MutexLock lock(&mu_);
      // One read at a time has the holder check its copy; the others wait
      // for its verdict instead of each hashing the whole piece there.
      auto settled = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return checking_.count(id) == 0;
      };
      mu_.Await(absl::Condition(&settled));
      if (damaged_.count(id) != 0) continue;
      check = checked_.count(id) == 0;
      if (check) checking_.insert(id);
    }
    const absl::Status st = ReadFrom(holder, file, offset, dst, n, check);
    const bool damaged = absl::IsDataLoss(st) || absl::IsNotFound(st);
    {
      zcc::MutexLock lock(&mu_);
      if (check) {
        checking_.erase(id);
        if (st.ok()) checked_.insert(id);
      }
      if (damaged) damaged_.insert(id);
    }
    if (st.ok()) return st;
    if (cancel_.cancelled()) return absl::CancelledError("zccd stops");
    ZCC_LOG(WARNING) << "job " << file.key.job_id << ": bytes [" << offset << ", +" << n << ") of "
                     << file.key.piece << " of step " << step_ << " from "
                     << (holder.empty() ? "this zccd" : holder) << ": " << st
                     << (file.holders.size() > 1 ? "; trying the next holder" : "");
    last = st;
  }
  // Whatever the holders' errors (one gone, one damaged): the step cannot be
  // read, and the restore falls back to an older one as for damage on disk.
  return absl::DataLossError(absl::StrCat(
      file.key.piece, " of step ", step_, " (rank ", file.key.rank,
      ", read from the peer tier): no holder served bytes [", offset, ", +", n,
      "): ", last.ToString()));
}

bool RecoveredStep::Sealed() const {
  zcc::MutexLock lock(&mu_);
  return sealed_;
}

absl::StatusOr<std::unique_ptr<storage::File>> RecoveredStep::OpenForRead(
    const std::string& path, const storage::OpenOptions& options) {
  if (const Remote* remote = RemoteAt(path)) {
    return std::unique_ptr<storage::File>(
        new PulledFile(shared_from_this(), path, remote, options.queue_depth));
  }
  return small_.OpenForRead(path, options);
}

absl::StatusOr<storage::FileInfo> RecoveredStep::Stat(const std::string& path) {
  if (const Remote* remote = RemoteAt(path)) {
    storage::FileInfo info;
    info.size = remote->bytes;
    return info;
  }
  return small_.Stat(path);
}

absl::StatusOr<std::vector<std::string>> RecoveredStep::List(const std::string& path) {
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, small_.List(path));
  if (path == dir_ || path == partial_dir_) {
    for (const auto& [name, remote] : remote_) names.push_back(name);
    std::sort(names.begin(), names.end());
  }
  return names;
}

absl::StatusOr<std::unique_ptr<storage::File>> RecoveredStep::OpenForWrite(
    const std::string& path, const storage::OpenOptions& options) {
  if (Sealed() || RemoteAt(path) != nullptr) return ReadOnly(path);
  return small_.OpenForWrite(path, options);
}

absl::Status RecoveredStep::MakeDirs(const std::string& path) {
  if (Sealed()) return ReadOnly(path);
  return small_.MakeDirs(path);
}

absl::Status RecoveredStep::SyncDir(const std::string& path) {
  if (Sealed()) return ReadOnly(path);
  return small_.SyncDir(path);
}

absl::Status RecoveredStep::Rename(const std::string& from, const std::string& to) {
  if (Sealed()) return ReadOnly(from);
  return small_.Rename(from, to);
}

absl::Status RecoveredStep::Exchange(const std::string& a, const std::string& b) {
  if (Sealed()) return ReadOnly(a);
  return small_.Exchange(a, b);
}

absl::Status RecoveredStep::Remove(const std::string& path) {
  if (Sealed() || RemoteAt(path) != nullptr) return ReadOnly(path);
  return small_.Remove(path);
}

absl::Status RecoveredStep::RemoveTree(const std::string& path) {
  if (Sealed()) return ReadOnly(path);
  return small_.RemoveTree(path);
}

std::shared_ptr<RecoveredStep> RecoverInPlace(const std::string& job_id, uint32_t uid,
                                              const std::string& job_dir, int64_t newer_than,
                                              const RecoverySources& sources) {
  std::shared_ptr<RecoveredStep> found;
  ForNewestSteps(job_id, uid, newer_than, sources, [&](const RecoveryPlan& plan) {
    auto made = RecoveredStep::Make(job_id, uid, job_dir, plan, sources);
    if (!made.ok()) {
      ZCC_LOG(WARNING) << "job " << job_id << ": step " << plan.step
                       << " of the peer tier does not make a whole step: " << made.status();
      return false;
    }
    ZCC_LOG(INFO) << "job " << job_id << ": step " << plan.step
                  << " recovered from the peer tier, read in place (" << (*made)->remote_bytes()
                  << " bytes of shard files held by the job's zccds)";
    found = *std::move(made);
    return true;
  });
  return found;
}

}  // namespace zcc::daemon::peer
