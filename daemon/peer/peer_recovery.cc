#include "daemon/peer/peer_recovery.h"

#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/committer.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/whole_file.h"

namespace zcc::daemon::peer {
namespace {

constexpr char kSelf[] = "";  // the holder name of this zccd's own memory

// Who holds what: step -> rank -> holder -> the rank's file names there.
using Holdings = std::map<int64_t, std::map<uint32_t, std::map<std::string, std::set<std::string>>>>;

void Note(Holdings& h, const std::string& holder, const ReplicaInfo& info) {
  h[info.key.step][info.key.rank][holder].insert(info.key.piece);
}

// A piece's bytes: this zccd's own without a copy (the pointer shares the
// held piece), a peer's as pulled and checked.
absl::StatusOr<std::shared_ptr<const std::string>> Fetch(const std::string& holder,
                                                         const ReplicaKey& key,
                                                         const RecoverySources& s) {
  if (holder == kSelf) {
    ZCC_ASSIGN_OR_RETURN(std::shared_ptr<const Replica> r, s.own->Get(key));
    return std::shared_ptr<const std::string>(r, &r->bytes);
  }
  ZCC_ASSIGN_OR_RETURN(std::string pulled, s.directory->Client(holder)->Pull(key, s.timeout));
  return std::make_shared<const std::string>(std::move(pulled));
}

// Each rank's holders of a step, in the order they are tried (this zccd
// first), each with the rank's file names there.
using Plan = std::map<uint32_t, std::vector<std::pair<std::string, std::set<std::string>>>>;

// Writes every file of `step` into step-N.partial/, each from the first
// holder that serves it intact, and commits it.
absl::Status Materialize(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                         int64_t step, const Plan& plan, uint32_t world, storage::Storage& fs,
                         const RecoverySources& s) {
  const std::string dir = JoinPath(job_dir, format::PartialStepDirName(step));
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(dir));
  for (const auto& [rank, holders] : plan) {
    // The names the first holder lists (it holds the rank's manifest: all of them).
    for (const std::string& name : holders.front().second) {
      absl::Status last = absl::NotFoundError("no holder");
      bool written = false;
      for (const auto& [holder, files] : holders) {
        if (files.count(name) == 0) continue;
        auto bytes = Fetch(holder, ReplicaKey{job_id, uid, rank, step, name}, s);
        if (!bytes.ok()) {
          // Damaged or gone: the next holder.
          ZCC_LOG(WARNING) << "job " << job_id << ": " << name << " of step " << step << " from "
                           << (holder.empty() ? "this zccd" : holder) << ": " << bytes.status();
          last = bytes.status();
          continue;
        }
        ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, JoinPath(dir, name), **bytes));
        written = true;
        break;
      }
      if (!written) {
        return absl::Status(last.code(), absl::StrCat(name, " of rank ", rank, ": ", last.message()));
      }
    }
  }
  ZCC_ASSIGN_OR_RETURN(checkpoint::CommitResult result,
                       checkpoint::TryCommit(job_dir, job_id, step, world, &fs));
  if (result.outcome != checkpoint::CommitOutcome::kCommitted) {
    return absl::DataLossError(absl::StrCat("only ", result.manifests_present, " of ", world,
                                            " ranks' manifests arrived"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> RecoverNewestStep(const std::string& job_id, uint32_t uid,
                                                         const std::string& job_dir,
                                                         int64_t newer_than,
                                                         storage::Storage& fs,
                                                         const RecoverySources& s) {
  Holdings held;
  for (const ReplicaInfo& info : s.own->List(job_id, uid)) Note(held, kSelf, info);
  for (const std::string& peer : s.peers) {
    auto listed = s.directory->Client(peer)->List(job_id, uid, absl::Seconds(10));
    if (!listed.ok()) {
      ZCC_LOG(WARNING) << "job " << job_id << ": peer " << peer
                       << " cannot be asked for its replicas: " << listed.status();
      continue;
    }
    for (const ReplicaInfo& info : *listed) Note(held, peer, info);
  }
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    const int64_t step = it->first;
    if (step <= newer_than) break;
    // The holders of each rank's manifest (written last: the rank's files
    // are all there) that decodes, and the world size it names.
    Plan plan;
    std::optional<uint32_t> world;
    std::string why;
    for (const auto& [rank, holders] : it->second) {
      const std::string manifest = format::ManifestFileName(rank);
      for (const auto& [holder, files] : holders) {
        if (files.count(manifest) == 0) continue;
        auto bytes = Fetch(holder, ReplicaKey{job_id, uid, rank, step, manifest}, s);
        if (!bytes.ok()) {
          why = std::string(bytes.status().message());
          continue;
        }
        auto decoded = format::DecodeRankManifest(**bytes);
        if (!decoded.ok()) {
          why = absl::StrCat("rank ", rank, "'s manifest from ", holder.empty() ? "here" : holder,
                             ": ", decoded.status().message());
          continue;
        }
        world = decoded->world_size;
        plan[rank].push_back({holder, files});
      }
    }
    if (!world.has_value() || plan.size() != *world) {
      ZCC_LOG(INFO) << "job " << job_id << ": step " << step << " of the peer tier is incomplete ("
                    << plan.size() << " of " << (world.has_value() ? *world : 0)
                    << " ranks held)" << (why.empty() ? "" : ": ") << why;
      continue;
    }
    const absl::Status made = Materialize(job_id, uid, job_dir, step, plan, *world, fs, s);
    if (made.ok()) {
      ZCC_LOG(INFO) << "job " << job_id << ": step " << step
                    << " recovered from the peer tier into " << job_dir;
      return step;
    }
    ZCC_LOG(WARNING) << "job " << job_id << ": step " << step
                     << " of the peer tier could not be recovered: " << made;
  }
  ZCC_LOG(INFO) << "job " << job_id << ": the peer tier holds no whole step newer than "
                << (newer_than < 0 ? std::string("none") : absl::StrCat("step ", newer_than))
                << " (this zccd's memory and " << s.peers.size()
                << " peer(s) asked): the restore uses what the job's directory has";
  return std::optional<int64_t>();
}

}  // namespace zcc::daemon::peer
