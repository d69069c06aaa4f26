#include "daemon/peer/peer_recovery.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/io_pipeline.h"
#include "storage/whole_file.h"

namespace zcc::daemon::peer {
namespace {

constexpr char kPullSuffix[] = ".pull.";  // a file being pulled: <name>.pull.<pid>.<n>
// The longest a manifest's pull may take before its holder is passed over.
constexpr absl::Duration kManifestTimeout = absl::Seconds(30);

// The most bytes reserved at once for a piece pulled into memory: its size
// comes from the peer, and an allocation that fails would end zccd (a
// larger piece grows as it arrives, up to the size it was checked against).
constexpr uint64_t kMaxReserve = uint64_t{256} << 20;

// A piece's bytes as `holder` serves them: this zccd's own without a copy
// (the pointer shares the held piece), checked against the checksum it was
// kept with; a peer's as pulled (within `timeout`) and checked. `size_ok`
// says whether a size may be the piece's: a peer's announcement is refused
// before anything is allocated for it.
absl::StatusOr<std::shared_ptr<const std::string>> Fetch(
    const std::string& holder, const ReplicaKey& key, const RecoverySources& s,
    absl::Duration timeout, absl::FunctionRef<absl::Status(uint64_t)> size_ok) {
  if (holder == kThisZccd) {
    ZCC_ASSIGN_OR_RETURN(std::shared_ptr<const Replica> r, s.own->Get(key));
    ZCC_RETURN_IF_ERROR(size_ok(r->bytes.size()));
    if (format::Xxh3(r->bytes.data(), r->bytes.size()) != r->info.xxh3) {
      return absl::DataLossError(absl::StrCat(
          "this zccd's copy of piece '", key.piece, "' of step ", key.step,
          " no longer matches its checksum (damaged in memory)"));
    }
    return std::shared_ptr<const std::string>(r, &r->bytes);
  }
  auto bytes = std::make_shared<std::string>();
  ZCC_RETURN_IF_ERROR(s.directory->Client(holder)->PullInto(
      key, timeout,
      [&](uint64_t n) {
        ZCC_RETURN_IF_ERROR(size_ok(n));
        bytes->reserve(std::min(n, kMaxReserve));
        return absl::OkStatus();
      },
      [&](absl::string_view chunk) {
        bytes->append(chunk.data(), chunk.size());
        return absl::OkStatus();
      },
      s.cancel));
  return std::shared_ptr<const std::string>(std::move(bytes));
}

// A data file of a rank's step is as long as the rank's manifest says.
auto SizeIs(const std::string& name, uint64_t expected) {
  return [&name, expected](uint64_t n) {
    if (n == expected) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("the holder's ", name, " is ", n,
                                            " bytes; the rank's manifest says ", expected));
  };
}

// Pulls `key` from a peer straight into `path`: chunk by chunk into a
// temporary file as it arrives (no copy of the piece in memory; the disk
// writes while the network delivers), renamed into place once the piece is
// whole and checked, removed otherwise. The peer's size must be `expected`.
absl::Status PullToFile(PeerClient& peer, const ReplicaKey& key, uint64_t expected,
                        storage::Storage& fs, const std::string& path, absl::Duration timeout,
                        CallCancel* cancel) {
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp = absl::StrCat(path, kPullSuffix, ::getpid(), ".", sequence.fetch_add(1));
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file,
                       fs.OpenForWrite(tmp, storage::OpenOptions()));
  uint64_t offset = 0;
  absl::Status st = peer.PullInto(
      key, timeout, SizeIs(key.piece, expected),
      [&](absl::string_view chunk) {
        const absl::Status written = storage::WriteAt(*file, offset, chunk.data(), chunk.size());
        offset += chunk.size();
        return written;
      },
      cancel);
  if (st.ok()) st = file->Sync();
  const absl::Status closed = file->Close();
  if (st.ok()) st = closed;
  if (st.ok()) st = fs.Rename(tmp, path);
  if (!st.ok()) (void)fs.Remove(tmp);
  return st;
}

// Writes the data file `key` of `expected` bytes from `holder` into `path`.
absl::Status Place(const std::string& holder, const ReplicaKey& key, uint64_t expected,
                   storage::Storage& fs, const std::string& path, const RecoverySources& s) {
  // A peer's piece streams into the file where the storage writes files in
  // parts (an object store writes each whole: through memory).
  if (holder != kThisZccd && !fs.atomic_file_writes(path)) {
    return PullToFile(*s.directory->Client(holder), key, expected, fs, path, s.timeout, s.cancel);
  }
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> bytes,
                       Fetch(holder, key, s, s.timeout, SizeIs(key.piece, expected)));
  return storage::WriteFileAtomic(fs, path, *bytes);
}

// Writes `rank`'s part of `step` into `dir`: each file its manifest names
// (plain names, checked as it was decoded; not the names a holder lists)
// from the first of `holders` that serves it intact and as long as the
// manifest says, then the manifest itself, as held.
absl::Status PlaceRank(const std::string& job_id, uint32_t uid, const std::string& dir,
                       int64_t step, uint32_t rank, const RecoveryPlan& plan,
                       storage::Storage& fs, const RecoverySources& s) {
  const RankHolders& holders = plan.ranks.at(rank);
  uint64_t bytes = 0;
  const absl::Time began = absl::Now();
  for (const format::ManifestFile& f : plan.decoded.at(rank).files) {
    const std::string& name = f.name;
    if (s.cancel != nullptr && s.cancel->cancelled()) {
      return absl::CancelledError(absl::StrCat("the write of step ", step, " was stopped"));
    }
    absl::Status last = absl::NotFoundError("no holder");
    bool written = false;
    for (const auto& [holder, files] : holders) {
      if (files.count(name) == 0) continue;
      const absl::Status placed = Place(holder, ReplicaKey{job_id, uid, rank, step, name}, f.bytes,
                                        fs, JoinPath(dir, name), s);
      if (!placed.ok()) {
        // Damaged or gone (or not writable here): the next holder.
        ZCC_LOG(WARNING) << "job " << job_id << ": " << name << " of step " << step << " from "
                         << (holder.empty() ? "this zccd" : holder) << ": " << placed;
        last = placed;
        continue;
      }
      bytes += f.bytes;
      written = true;
      break;
    }
    if (!written) {
      return absl::Status(last.code(), absl::StrCat(name, " of rank ", rank, ": ", last.message()));
    }
  }
  const std::string& manifest = plan.manifests.at(rank);
  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(dir, format::ManifestFileName(rank)), manifest));
  bytes += manifest.size();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - began);
  ZCC_LOG(INFO) << "job " << job_id << ": rank " << rank << " of step " << step << ", " << bytes
                << " bytes, fetched and written in " << seconds << " s ("
                << (seconds > 0 ? bytes / seconds / 1e9 : 0) << " GB/s)";
  return absl::OkStatus();
}

// A rank's manifest of a step as some holders serve it (the same bytes).
struct HeldManifest {
  std::string bytes;
  format::RankManifest decoded;
  RankHolders holders;
};

// Holders, as a log names them.
std::string HolderNames(const RankHolders& holders) {
  std::string names;
  for (const auto& [holder, files] : holders) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", holder.empty() ? "this zccd" : holder);
  }
  return names;
}

// The plan of `step` from `manifests` (each rank's, as held, moved from):
// the one run, timeline and world size whose manifests every rank of that
// world holds, each rank's files read only from the holders of its
// manifest. Nullopt, saying why in the log, where none is held whole, or
// several are (a step of a run left behind held whole beside the one that
// went on: which is newer cannot be told, and a restore must not take the
// step the job left). One held whole beside others held in part is taken,
// with a warning: a holder keeps what a run left only where it missed the
// going back (ReplicaStore::DropLeftBehind), and the step the job went on
// to write again may be the part.
std::optional<RecoveryPlan> PlanOfOneRun(const std::string& job_id, int64_t step,
                                         std::map<uint32_t, std::vector<HeldManifest>> manifests,
                                         const std::string& why) {
  using Line = std::tuple<std::string, std::string, uint32_t>;  // run, timeline, world
  // For each line, the rank's manifest on it (an index into manifests[rank]).
  std::map<Line, std::map<uint32_t, size_t>> lines;
  for (const auto& [rank, held] : manifests) {
    for (size_t i = 0; i < held.size(); ++i) {
      const format::RankManifest& m = held[i].decoded;
      if (m.rank != rank || m.world_size == 0) continue;  // (not the file it is held as)
      auto [at, fresh] = lines[{m.run_id, m.timeline, m.world_size}].emplace(rank, i);
      if (!fresh) {
        // (Holders' copies of one step agree byte for byte.)
        ZCC_LOG(WARNING) << "job " << job_id << ": rank " << rank << "'s manifest of step " << step
                         << " differs between holders of the same run and timeline; the files "
                         << "held by " << HolderNames(held[i].holders) << " are not read";
      }
    }
  }
  auto described = [](const Line& line) {
    auto named = [](const std::string& v) { return v.empty() ? "none" : "'" + v + "'"; };
    return absl::StrCat("run ", named(std::get<0>(line)), " timeline ", named(std::get<1>(line)),
                        " of ", std::get<2>(line), " ranks");
  };
  std::vector<const Line*> whole;
  std::string partial;
  for (const auto& [line, ranks] : lines) {
    const uint32_t world = std::get<2>(line);
    if (ranks.size() == world && ranks.rbegin()->first < world) {
      whole.push_back(&line);
    } else {
      absl::StrAppend(&partial, partial.empty() ? "" : "; ", described(line), ": ", ranks.size(),
                      " held");
    }
  }
  if (whole.empty()) {
    const std::string held =
        lines.size() > 1
            ? absl::StrCat("no run and timeline held for every rank: ", partial)
            : absl::StrCat(lines.empty() ? 0 : lines.begin()->second.size(), " of ",
                           lines.empty() ? 0 : std::get<2>(lines.begin()->first), " ranks held");
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step << " of the peer tier is incomplete ("
                  << held << ")" << (why.empty() ? "" : ": ") << why;
    return std::nullopt;
  }
  if (whole.size() > 1) {
    std::string runs;
    for (const Line* line : whole) {
      absl::StrAppend(&runs, runs.empty() ? "" : "; ", described(*line));
    }
    ZCC_LOG(WARNING) << "job " << job_id << ": step " << step << " of the peer tier is held whole "
                     << "in " << whole.size() << " runs or timelines (" << runs << "): which one "
                     << "the job went on in cannot be told here; passed over";
    return std::nullopt;
  }
  if (!partial.empty()) {
    ZCC_LOG(WARNING) << "job " << job_id << ": step " << step << " of the peer tier is held whole "
                     << "in one run and timeline (" << described(*whole.front())
                     << "), in part in others (" << partial << "); the whole one is taken";
  }
  RecoveryPlan plan;
  plan.step = step;
  plan.world = std::get<2>(*whole.front());
  for (const auto& [rank, i] : lines.at(*whole.front())) {
    HeldManifest& m = manifests[rank][i];
    plan.ranks[rank] = std::move(m.holders);
    plan.manifests.emplace(rank, std::move(m.bytes));
    plan.decoded.emplace(rank, std::move(m.decoded));
  }
  return plan;
}

}  // namespace

absl::Status MaterializeStep(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                             const RecoveryPlan& plan, storage::Storage& fs,
                             const RecoverySources& s, const MaterializeOptions& options) {
  const int64_t step = plan.step;
  const uint32_t world = plan.world;
  // Where steps are renamed into place, a directory of its own: the job's
  // writers of its own step N (after a restore that fell back past this
  // one) write theirs beside it, and neither takes the other's files.
  const bool own_dir = !checkpoint::CommitsInPlace(fs, job_dir);
  const std::string dir = own_dir ? checkpoint::RecoveringStepDir(job_dir, step)
                                  : JoinPath(job_dir, format::PartialStepDirName(step));
  const absl::Status written = [&]() -> absl::Status {
    ZCC_RETURN_IF_ERROR(fs.MakeDirs(dir));
    // A pull cut short by a crash of an earlier zccd left its temporary file
    // here: gone before the step can commit with it.
    ZCC_ASSIGN_OR_RETURN(std::vector<std::string> present, fs.List(dir));
    for (const std::string& name : present) {
      if (absl::StrContains(name, kPullSuffix)) {
        ZCC_RETURN_IF_ERROR(fs.Remove(JoinPath(dir, name)));
      }
    }
    // The ranks several at a time: on a cluster their holders are different
    // nodes, and each stream alone leaves the links and disks idle.
    std::vector<const std::pair<const uint32_t, RankHolders>*> ranks;
    for (const auto& entry : plan.ranks) ranks.push_back(&entry);
    std::atomic<size_t> next{0};
    zcc::Mutex mu;
    absl::Status first_error;
    auto worker = [&] {
      for (size_t i = next.fetch_add(1); i < ranks.size(); i = next.fetch_add(1)) {
        const absl::Status st = PlaceRank(job_id, uid, dir, step, ranks[i]->first, plan, fs, s);
        if (!st.ok()) {
          zcc::MutexLock lock(&mu);
          if (first_error.ok()) first_error = st;
          next.store(ranks.size());  // the step cannot be had whole: stop
        }
      }
    };
    std::vector<std::thread> threads;
    const size_t n = std::min<size_t>(std::max<size_t>(options.parallel_ranks, 1), ranks.size());
    for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
    worker();
    for (std::thread& t : threads) t.join();
    {
      zcc::MutexLock lock(&mu);
      ZCC_RETURN_IF_ERROR(first_error);
    }
    auto commit = [&]() -> absl::Status {
      ZCC_RETURN_IF_ERROR(fs.SyncDir(dir));
      ZCC_ASSIGN_OR_RETURN(
          checkpoint::CommitResult result,
          checkpoint::TryCommit(job_dir, job_id, step, world, &fs, options.write_began,
                                own_dir ? dir : ""));
      if (result.outcome != checkpoint::CommitOutcome::kCommitted) {
        if (result.mixed_runs) {
          return absl::DataLossError(absl::StrCat("its ranks' manifests are of different runs "
                                                  "or timelines (", result.mixed, ")"));
        }
        return absl::DataLossError(absl::StrCat("only ", result.manifests_present, " of ", world,
                                                " ranks' manifests arrived"));
      }
      return absl::OkStatus();
    };
    return options.in_turn ? options.in_turn(commit) : commit();
  }();
  // (Its own directory goes whatever kept it from being committed.)
  if (absl::IsAborted(written) || (own_dir && !written.ok())) {
    const absl::Status removed = fs.RemoveTree(dir);
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      ZCC_LOG(WARNING) << "job " << job_id << ": step " << step << " was not committed ("
                       << written.message() << "), and what was written of it in " << dir
                       << " is left (retention removes it): " << removed;
    }
  }
  return written;
}


void ForNewestSteps(const std::string& job_id, uint32_t uid, int64_t newer_than,
                    const RecoverySources& s,
                    absl::FunctionRef<bool(const RecoveryPlan&)> next) {
  const Holdings held = ListHoldings(job_id, uid, TierSources{s.own, s.directory, s.peers, s.cancel},
                                     absl::Seconds(10));
  size_t offered = 0;  // whole steps handed to `next`
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    const int64_t step = it->first;
    if (step <= newer_than) break;
    // Each rank's manifests (written last: the rank's files are all there)
    // that decode, each with the holders that serve it: holders may hold
    // different steps of this number (of a run or timeline left behind).
    std::map<uint32_t, std::vector<HeldManifest>> manifests;
    std::string why;
    for (const auto& [rank, holders] : it->second) {
      const std::string manifest = format::ManifestFileName(rank);
      for (const auto& [holder, files] : holders) {
        if (files.count(manifest) == 0) continue;
        // (A few MB at most: a holder that does not answer soon is passed over.)
        auto bytes = Fetch(holder, ReplicaKey{job_id, uid, rank, step, manifest}, s,
                           std::min(s.timeout, kManifestTimeout), [&manifest](uint64_t n) {
                             if (n <= format::kMaxManifestBytes) return absl::OkStatus();
                             return absl::DataLossError(absl::StrCat(
                                 "its ", manifest, " is ", n, " bytes, over the ",
                                 format::kMaxManifestBytes, " a manifest may be"));
                           });
        if (!bytes.ok()) {
          why = std::string(bytes.status().message());
          continue;
        }
        std::vector<HeldManifest>& held_here = manifests[rank];
        auto same = std::find_if(held_here.begin(), held_here.end(),
                                 [&](const HeldManifest& m) { return m.bytes == **bytes; });
        if (same != held_here.end()) {
          same->holders.push_back({holder, files});
          continue;
        }
        auto decoded = format::DecodeRankManifest(**bytes);
        if (!decoded.ok()) {
          why = absl::StrCat("rank ", rank, "'s manifest from ", holder.empty() ? "here" : holder,
                             ": ", decoded.status().message());
          continue;
        }
        held_here.push_back(HeldManifest{**bytes, *std::move(decoded), {{holder, files}}});
      }
    }
    std::optional<RecoveryPlan> plan = PlanOfOneRun(job_id, step, std::move(manifests), why);
    if (!plan.has_value()) continue;
    ++offered;
    if (next(*plan)) return;
  }
  const std::string than =
      newer_than < 0 ? std::string("none") : absl::StrCat("step ", newer_than);
  if (offered > 0) {
    ZCC_LOG(INFO) << "job " << job_id << ": no step of the peer tier newer than " << than
                  << " could be used (each reason above): the restore uses what the job's "
                  << "directory has";
    return;
  }
  ZCC_LOG(INFO) << "job " << job_id << ": the peer tier holds no whole step newer than " << than
                << " (this zccd's memory and " << s.peers.size()
                << " peer(s) asked): the restore uses what the job's directory has";
}

absl::StatusOr<std::optional<int64_t>> RecoverNewestStep(const std::string& job_id, uint32_t uid,
                                                         const std::string& job_dir,
                                                         int64_t newer_than,
                                                         storage::Storage& fs,
                                                         const RecoverySources& s) {
  std::optional<int64_t> recovered;
  ForNewestSteps(job_id, uid, newer_than, s, [&](const RecoveryPlan& plan) {
    const absl::Status made = MaterializeStep(job_id, uid, job_dir, plan, fs, s);
    if (made.ok()) {
      ZCC_LOG(INFO) << "job " << job_id << ": step " << plan.step
                    << " recovered from the peer tier into " << job_dir;
      recovered = plan.step;
      return true;
    }
    ZCC_LOG(WARNING) << "job " << job_id << ": step " << plan.step
                     << " of the peer tier could not be recovered: " << made;
    return false;
  });
  return recovered;
}

}  // namespace zcc::daemon::peer
