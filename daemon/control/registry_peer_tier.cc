// Registry's side of the peer tier (DESIGN.md 5c): the peer endpoint and
// its replicator, the job's nodes and buddies, replication of a rank's step,
// recovery of a step from the tier, the job's newest whole step pinned in
// this zccd's replica memory, and the tier's status and gauges.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/fs_identity.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "daemon/control/registry.h"
#include "daemon/peer/buddies.h"
#include "daemon/peer/memory_tier.h"
#include "daemon/peer/peer_recovery.h"
#include "daemon/peer/recovered_step.h"
#include "daemon/restore/restore_tiers.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

namespace {

// How long no restore has read a recovered step before it is written to
// disk: the ranks of a node restore together, their reads a few files at
// a time.
constexpr absl::Duration kRecoveredStepQuiet = absl::Seconds(3);

}  // namespace

void Registry::RecoverFromPeers(const std::shared_ptr<Job>& job, uint32_t rank) {
  std::shared_ptr<peer::PeerDirectory> directory;
  std::shared_ptr<zcc::Mutex> one_at_a_time;
  std::string self;
  {
    zcc::MutexLock lock(&peer_mu_);
    if (peer_directory_ == nullptr) return;
    directory = peer_directory_;
    self = peer_address_;
    std::shared_ptr<zcc::Mutex>& mu = recovering_[job->options().job_id];
    if (mu == nullptr) mu = std::make_shared<zcc::Mutex>();
    one_at_a_time = mu;
  }
  peer::RecoverySources sources;
  sources.own = &replicas_;
  sources.directory = directory.get();
  for (const std::string& address : NodesOf(*job)) {
    if (address != self) sources.peers.push_back(address);
  }
  // The job's ranks on this node ask together: the first finds the step,
  // the others then find it shown under the job's directory.
  zcc::MutexLock lock(one_at_a_time.get());
  ScopedFsIdentity as_owner(job->options().owner);
  const std::string& job_dir = job->options().job_dir;
  if (std::shared_ptr<peer::RecoveredStep> shown = recovered_.Find(job_dir)) {
    // Found by an earlier rank here: this restore reads it too (rank 0's
    // makes this zccd the one that writes it to disk). One let go already
    // goes now, and is found anew below.
    if (!shown->Touch(rank == 0)) recovered_.Remove(shown.get());
  }
  // Newer than every committed step, those a run that went back left behind
  // included: holders that missed the rank's step after it went back (its
  // buddies drop the newer ones when it arrives) may still hold those, and
  // step numbers alone do not tell the runs apart.
  auto local = RestoreTiers::AllSteps(job_dir, job->options().upload_dir, &recovered_,
                                      RestoreTiers::Steps::kAll);
  if (!local.ok()) return;  // the restore reports it
  const int64_t newest = local->empty() ? -1 : *local->rbegin();
  const absl::Time began = absl::Now();
  std::shared_ptr<peer::RecoveredStep> step =
      peer::RecoverInPlace(job->options().job_id, static_cast<uint32_t>(job->options().owner.uid),
                           job_dir, newest, sources);
  if (step == nullptr) return;
  step->Touch(rank == 0);
  // Shown to restores from now on: they read it in place, straight into
  // each rank's staging memory, while it is written to disk behind them.
  recovered_.Add(step);
  WriteRecoveredStep(job, step, began);
}

void Registry::WriteRecoveredStep(const std::shared_ptr<Job>& job,
                                  const std::shared_ptr<peer::RecoveredStep>& step,
                                  absl::Time began) {
  std::vector<RecoveredStepWriter> finished;
  {
    zcc::MutexLock lock(&peer_mu_);
    if (stopped_.load()) return;  // shut down: shown until zccd ends; recovered again after
    // Those done since the last recovery are joined below (outside the
    // lock: a thread may still be dropping the last reference to its job).
    for (auto it = writing_recovered_.begin(); it != writing_recovered_.end();) {
      if (it->done->load()) {
        finished.push_back(std::move(*it));
        it = writing_recovered_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread writer([this, job, step, began, done] {
      WriteRecoveredStepNow(*job, *step, began);
      // A later restore finds it anew where it is not written; the checks'
      // verdicts on its directory go with it (a step written there since is
      // checked afresh).
      recovered_.Remove(step.get());
      restores_.ForgetChecks(step->dir());
      done->store(true);
    });
    writing_recovered_.push_back({std::move(writer), std::move(done), step});
  }
  for (RecoveredStepWriter& w : finished) w.thread.join();
}

void Registry::WriteRecoveredStepNow(Job& job, peer::RecoveredStep& step, absl::Time began) {
  const std::string& job_id = job.options().job_id;
  const std::string& job_dir = job.options().job_dir;
  // Behind the restores, which read the same holders: after them, unless
  // they leave the step alone longer than kRecoveredStepQuiet.
  const peer::RecoveredStep::AfterQuiet after = step.AwaitQuiet(kRecoveredStepQuiet);
  auto left_behind = [&] {
    if (!step.left_behind()) return false;
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step.step() << " of the peer tier not "
                  << "written into " << job_dir << ": training went on from an older step";
    return true;
  };
  if (left_behind()) return;
  if (after == peer::RecoveredStep::AfterQuiet::kCancelled) return;  // zccd stops
  if (after == peer::RecoveredStep::AfterQuiet::kLetGo) {
    // Every node whose ranks restore reads the step in place; one writes
    // it (rank 0's), not every node the whole of it.
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step.step()
                  << " of the peer tier read in place here; rank 0's zccd writes it to disk";
    return;
  }
  ScopedFsIdentity as_owner(job.options().owner);
  storage::Storage& fs = storage::StorageOrDefault(shard_storage_);
  // The job went on and committed this step or a newer one meanwhile
  // (here or in its store): this one is not wanted on disk any more.
  auto superseded = [&] {
    auto steps = RestoreTiers::AllSteps(job_dir, job.options().upload_dir, &fs,
                                        RestoreTiers::Steps::kAll);
    return steps.ok() && !steps->empty() && *steps->rbegin() >= step.step();
  };
  peer::RecoverySources sources = step.sources();
  sources.cancel = step.cancel();
  peer::MaterializeOptions options;
  options.write_began = began;
  // At idle priority, on this thread alone (threads it started would
  // inherit the priority, and a stopping zccd un-idles this one only).
  options.parallel_ranks = 1;
  // Checked and committed in turn with the job's own commits: `latest`
  // never moves back past a step the job committed meanwhile.
  options.in_turn = [&](const std::function<absl::Status()>& commit) {
    // Not at idle priority while holding the job's commits up.
    LeaveIdlePriority(pthread_self());
    return job.CommitInTurn([&]() -> absl::Status {
      if (step.left_behind()) return absl::AbortedError("training went on from an older step");
      if (superseded()) return absl::AbortedError("the job committed this step or a newer one");
      return commit();
    });
  };
  const absl::Time start = absl::Now();
  absl::Status written = absl::AbortedError("the job committed this step or a newer one");
  if (step.cancel()->cancelled()) {
    written = absl::CancelledError("zccd stops");
  } else if (!superseded()) {
    IdlePriority idle;
    written = peer::MaterializeStep(job_id, static_cast<uint32_t>(job.options().owner.uid),
                                    job_dir, step.plan(), fs, sources, options);
  }
  if (!written.ok() && left_behind()) return;
  if (written.ok()) {
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step.step() << " of the peer tier written into "
                  << job_dir << " in " << absl::ToDoubleSeconds(absl::Now() - start) << " s";
    if (!shutting_down_.load()) job.OnCommittedOutside(step.step(), began);
  } else if (absl::IsCancelled(written)) {
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step.step()
                  << " of the peer tier not written into " << job_dir << ": zccd stops";
  } else if (absl::IsAborted(written)) {
    ZCC_LOG(INFO) << "job " << job_id << ": step " << step.step()
                  << " of the peer tier not written into " << job_dir << ": "
                  << written.message();
  } else {
    // A later restore finds it in the tier again (and tries again here).
    ZCC_LOG(WARNING) << "job " << job_id << ": step " << step.step()
                     << " of the peer tier could not be written into " << job_dir << ": "
                     << written;
  }
}

void Registry::SetPeerEndpoint(v1::PeerStatus endpoint, std::string address,
                               std::shared_ptr<grpc::ChannelCredentials> creds) {
  peer::PeerDirectory::Options options;
  options.self_node = endpoint.node();
  options.self_failure_domain = endpoint.failure_domain();
  auto directory = std::make_shared<peer::PeerDirectory>(options, std::move(creds));
  for (const std::string& p : config_.peer.static_peers) {
    if (p != address) directory->Watch(p);
  }
  peer::Replicator::Options replicate;
  replicate.self_node = endpoint.node();
  replicate.bytes_per_s = config_.peer.replicate_bytes_per_s;
  replicate.check_buddies_every = config_.peer.check_buddies_every;
  replicate.push_connections = static_cast<int>(config_.peer.push_connections);
  replicate.bytes_sent = &metrics_.replication_bytes_sent();
  replicate.pushed_again = &metrics_.replication_pushed_again();
  replicate.after_push = [this](const std::string& job_id, uint32_t uid,
                                peer::CallCancel* cancel) {
    PinMemoryTier(job_id, uid, cancel);
  };
  auto replicator = std::make_shared<peer::Replicator>(
      replicate, &replicas_, directory.get(),
      [this](const std::string& job_id) { return BuddiesOf(job_id); });
  zcc::MutexLock lock(&peer_mu_);
  peer_endpoint_ = std::move(endpoint);
  peer_address_ = std::move(address);
  peer_directory_ = std::move(directory);
  replicator_ = std::move(replicator);
}

void Registry::PinMemoryTier(const std::string& job_id, uint32_t uid, peer::CallCancel* cancel) {
  std::shared_ptr<Job> job = jobs_.Find(job_id);
  const PeerParts peer = CurrentPeerParts();
  if (job == nullptr || peer.directory == nullptr) return;
  // A pin found from holdings listed before the job went back here may be
  // a step of the run it left: not taken, and not told (the next round,
  // after the new run's next push, finds the pin again).
  const uint64_t as_of = replicas_.went_back_count(job_id, uid);
  const std::string leader = PinLeader(*job, peer);
  if (!leader.empty() && leader != peer.self) {
    // One call: the leader asks every zccd of the job and sends the pin
    // when it changes; its answer is the pin it holds now.
    const absl::StatusOr<int64_t> nudged =
        peer.directory->Client(leader)->PinStep(job_id, uid, -1, false, absl::Seconds(10), cancel);
    if (nudged.ok()) {
      if (*nudged >= 0) {
        ApplyPin(job_id, uid, *nudged, false, ", as the job's pin leader found", as_of);
      }
      return;
    }
    if (absl::IsCancelled(nudged.status())) return;
    ZCC_LOG(WARNING) << "job " << job_id << ": its pin leader " << leader << " did not answer ("
                     << nudged.status() << "); this zccd finds the pin itself";
  }
  // Only the zccds the directory has up are asked: this runs on the
  // replicator's thread, and a peer that is down would hold up its other
  // pins and the buddies' checks for the whole timeout.
  peer::TierSources sources{&replicas_, peer.directory.get(), {}, cancel};
  size_t down = 0;
  for (const std::string& address : NodesOf(*job)) {
    if (address == peer.self) continue;
    const auto state = peer.directory->State(address);
    if (state.has_value() && state->up) {
      sources.peers.push_back(address);
    } else {
      ++down;
    }
  }
  size_t asked = 0;
  const peer::Holdings held = peer::ListHoldings(job_id, uid, sources, absl::Seconds(10), &asked);
  const std::optional<int64_t> whole = peer::NewestWholeStep(held, job->options().world_size);
  if (!whole.has_value()) return;
  // With a zccd down or not answering, what it holds is unknown: the pin
  // only moves on (a step whole without it is whole), never back.
  const bool everyone_answered = down == 0 && asked == sources.peers.size();
  ApplyPin(job_id, uid, *whole, everyone_answered, "", as_of);
  if (leader != peer.self) return;
  // The leader: each other node of the job (those its trainers reported)
  // that is up and has not taken this pin yet takes it now.
  const std::optional<int64_t> pinned = replicas_.pinned(job_id, uid);
  if (!pinned.has_value()) return;
  const std::pair<std::string, uint32_t> key(job_id, uid);
  size_t told = 0, due = 0;
  for (const auto& [address, ranks] : job->peers().Nodes()) {
    const auto state = peer.directory->State(address);
    if (address == peer.self || !state.has_value() || !state->up) continue;
    {
      zcc::MutexLock lock(&peer_mu_);
      auto sent = pins_sent_[key].find(address);
      if (sent != pins_sent_[key].end() && sent->second.step == *pinned &&
          sent->second.instance == state->instance) {
        continue;
      }
    }
    if (replicas_.went_back_count(job_id, uid) != as_of) return;
    ++due;
    const absl::StatusOr<int64_t> taken = peer.directory->Client(address)->PinStep(
        job_id, uid, *pinned, everyone_answered, absl::Seconds(10), cancel);
    if (!taken.ok()) {
      // Told again at the leader's next round, or it asks when it nudges.
      ZCC_LOG(WARNING) << "job " << job_id << ": step " << *pinned << " pinned here, not (yet) at "
                       << address << ": " << taken.status();
      continue;
    }
    ++told;
    zcc::MutexLock lock(&peer_mu_);
    // Not once the job went back meanwhile (JobWentOn clears the record
    // after the count moves): the pin told may be of the run left, and the
    // next round tells the pin again.
    if (replicas_.went_back_count(job_id, uid) != as_of) return;
    pins_sent_[key][address] = {*pinned, state->instance};
  }
  if (due > 0) {
    ZCC_LOG(INFO) << "job " << job_id << ": step " << *pinned << " pinned at " << told << " of "
                  << due << " other zccd(s) of the job that had not taken it (this one its pin "
                  << "leader)";
  }
}

bool Registry::ApplyPin(const std::string& job_id, uint32_t uid, int64_t whole,
                        bool everyone_answered, const char* found_by,
                        std::optional<uint64_t> as_of) {
  if (!replicas_.PinIfNewer(job_id, uid, whole, everyone_answered, as_of)) return false;
  ZCC_LOG(INFO) << "job " << job_id << ": step " << whole
                << " is the newest whole in the peer tier (every rank's files held by some "
                << "zccd" << found_by << "); kept in this zccd's replica memory until a newer one is";
  return true;
}

std::string Registry::PinLeader(const Job& job, const PeerParts& peer) const {
  const auto nodes = job.peers().Nodes();
  if (nodes.count(peer.self) == 0) return "";
  for (const auto& [address, ranks] : nodes) {  // in address order
    if (address == peer.self) return address;
    const auto state = peer.directory->State(address);
    if (state.has_value() && state->up) return address;
  }
  return "";
}

absl::StatusOr<int64_t> Registry::OnPeerPin(const std::string& job_id, uint32_t uid,
                                            int64_t step, bool everyone_answered) {
  // Only for a job with ranks here: a pin is lifted when the job leaves this
  // zccd, and one for a job never here would hold its step for good.
  std::shared_ptr<Job> job = jobs_.Find(job_id);
  if (job == nullptr || static_cast<uint32_t>(job->options().owner.uid) != uid) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " has no ranks on this zccd"));
  }
  if (step >= 0) {
    ApplyPin(job_id, uid, step, everyone_answered, ", as the job's pin leader found");
  } else {
    // A nudge: only the leader finds the pin for the others (one that does
    // not see itself as the leader says so, and the caller finds it itself).
    const PeerParts peer = CurrentPeerParts();
    std::shared_ptr<peer::Replicator> replicator = CurrentReplicator();
    if (replicator == nullptr || peer.directory == nullptr) {
      return absl::UnavailableError("the peer tier has stopped here");
    }
    if (PinLeader(*job, peer) != peer.self) {
      return absl::FailedPreconditionError(
          absl::StrCat("this zccd is not job ", job_id, "'s pin leader"));
    }
    replicator->PinSoon(job_id, uid);
  }
  return replicas_.pinned(job_id, uid).value_or(-1);
}

std::vector<std::string> Registry::NodesOf(const Job& job) const {
  std::set<std::string> nodes(config_.peer.static_peers.begin(), config_.peer.static_peers.end());
  for (const auto& [address, ranks] : job.peers().Nodes()) nodes.insert(address);
  return {nodes.begin(), nodes.end()};
}

std::optional<std::vector<std::string>> Registry::BuddiesOf(const std::string& job_id) const {
  std::shared_ptr<Job> job = jobs_.Find(job_id);
  if (job == nullptr) return std::nullopt;
  const PeerParts peer = CurrentPeerParts();
  if (peer.directory == nullptr) return std::vector<std::string>();
  return Buddies(*job, *peer.directory, peer.self);
}

void Registry::ReplicateStep(const std::string& job_id, uint32_t uid,
                             checkpoint::RankStepBytes step) {
  const std::shared_ptr<peer::Replicator> replicator = CurrentReplicator();
  if (replicator == nullptr) return;
  const int64_t n = step.step;
  const uint32_t rank = step.rank;
  if (absl::Status st = replicator->Enqueue(job_id, uid, std::move(step)); !st.ok()) {
    ZCC_LOG(WARNING) << "job " << job_id << " rank " << rank << ": step " << n
                     << " not replicated: " << st;
  }
}

std::vector<std::string> Registry::Buddies(const Job& job, const peer::PeerDirectory& directory,
                                           const std::string& self) const {
  std::vector<peer::NodeInfo> nodes;
  for (const std::string& address : NodesOf(job)) {
    const auto state = directory.State(address);
    nodes.push_back({address, state.has_value() ? state->failure_domain : ""});
  }
  std::string self_domain;
  {
    zcc::MutexLock lock(&peer_mu_);
    if (peer_endpoint_.has_value()) self_domain = peer_endpoint_->failure_domain();
  }
  return peer::ChooseBuddies({self, self_domain}, nodes, config_.peer.replicas);
}

absl::StatusOr<v1::SetJobPeersResponse> Registry::SetJobPeers(const v1::SetJobPeersRequest& req,
                                                             const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  const std::shared_ptr<Job>& job = found.first;
  const PeerParts peer = CurrentPeerParts();
  const std::shared_ptr<peer::PeerDirectory>& directory = peer.directory;
  const std::string& self = peer.self;
  if (directory == nullptr) {
    return absl::FailedPreconditionError(
        "this zccd's peer service is off (config peer.listen): it cannot take part in the "
        "peer tier");
  }
  std::vector<peer::JobPeer> peers;
  for (const v1::JobPeer& p : req.peers()) peers.push_back({p.rank(), p.address()});
  ZCC_RETURN_IF_ERROR(job->peers().Set(std::move(peers), job->options().world_size));
  for (const std::string& address : NodesOf(*job)) {
    if (address != self) directory->Watch(address);
  }
  v1::SetJobPeersResponse resp;
  for (const std::string& b : Buddies(*job, *directory, self)) resp.add_buddies(b);
  return resp;
}

Registry::PeerParts Registry::CurrentPeerParts() const {
  zcc::MutexLock lock(&peer_mu_);
  return PeerParts{peer_directory_, peer_address_};
}

void Registry::JobWentOn(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                         int64_t restored, absl::Time at) {
  // The replicator first: a push of the run left then ends as such when
  // its own copy goes, not as a failure.
  if (std::shared_ptr<peer::Replicator> replicator = CurrentReplicator()) {
    replicator->WentOn(job_id, uid, restored, at);
  }
  replicas_.DropLeftBehind(job_id, uid, restored, at);
  // A step recovered from the tier before the going on, newer than the step
  // the job went on from (a restore of an older step, or one that fell back
  // past it), is the run left behind's: it is not written to disk, where its
  // commit would put it on the new run's timeline, nor shown to restores any
  // more. (One recovered since is the run that went on's.)
  std::shared_ptr<peer::RecoveredStep> shown = recovered_.Find(job_dir);
  if (shown != nullptr && shown->step() > restored && shown->recovered_at() <= at) {
    if (shown->LeaveBehind()) {
      ZCC_LOG(INFO) << "job " << job_id << ": went on from step " << restored << ": step "
                    << shown->step() << " recovered from the peer tier is of the run it left, "
                    << "and is not written to disk";
    }
    recovered_.Remove(shown.get());
  }
  // A pin above the step is lifted here and at the other zccds: the pins
  // told are told again (the new run may pin a step of the same number).
  zcc::MutexLock lock(&peer_mu_);
  pins_sent_.erase({job_id, uid});
}

absl::StatusOr<bool> Registry::OnPeerWentBack(const std::string& job_id, uint32_t uid,
                                             int64_t restored, const std::set<uint32_t>& ranks,
                                             absl::Duration ago) {
  // A zccd with live ranks of the job learns it from them (Job::GoBack,
  // then JobWentOn), which also note how each rank went on.
  std::shared_ptr<Job> job = jobs_.Find(job_id);
  if (job != nullptr && static_cast<uint32_t>(job->options().owner.uid) == uid &&
      !job->Ranks().empty()) {
    return false;
  }
  replicas_.DropLeftBehind(job_id, uid, restored, absl::Now() - ago, &ranks);
  return true;
}

std::shared_ptr<peer::Replicator> Registry::CurrentReplicator() const {
  zcc::MutexLock lock(&peer_mu_);
  return replicator_;
}

void Registry::ExportPeerMetrics() {
  const auto [directory, self] = CurrentPeerParts();
  const std::shared_ptr<peer::Replicator> replicator = CurrentReplicator();
  if (directory == nullptr) return;
  double lag_seconds = 0;
  int64_t lag_steps = 0;
  std::set<std::string> up;
  std::set<std::string> down;
  for (const std::shared_ptr<Job>& job : jobs_.All()) {
    if (replicator != nullptr) {
      const peer::Replicator::JobStats r = replicator->Stats(job->options().job_id);
      lag_seconds = std::max(lag_seconds, r.lag_seconds);
      if (r.newest_step >= 0) {
        lag_steps = std::max(lag_steps, r.newest_step - std::max<int64_t>(r.replicated_step, 0));
      }
    }
    for (const std::string& address : NodesOf(*job)) {
      if (address == self) continue;
      const auto state = directory->State(address);
      (state.has_value() && state->up ? up : down).insert(address);
    }
  }
  for (const std::string& address : up) down.erase(address);
  metrics_.replication_lag_seconds().Set(lag_seconds);
  metrics_.replication_lag_steps().Set(static_cast<double>(lag_steps));
  metrics_.peers(true).Set(static_cast<double>(up.size()));
  metrics_.peers(false).Set(static_cast<double>(down.size()));
}

void Registry::FillPeerStatus(const Job& job, v1::JobStatus* out) const {
  out->set_replicated_step(-1);
  out->set_replication_newest_step(-1);
  out->set_memory_tier_step(
      replicas_.pinned(job.options().job_id, static_cast<uint32_t>(job.options().owner.uid))
          .value_or(-1));
  const auto [directory, self] = CurrentPeerParts();
  const std::shared_ptr<peer::Replicator> replicator = CurrentReplicator();
  if (directory == nullptr) return;
  if (replicator != nullptr) {
    const peer::Replicator::JobStats r = replicator->Stats(job.options().job_id);
    out->set_replicated_step(r.replicated_step);
    out->set_replication_newest_step(r.newest_step);
    out->set_replication_lag_seconds(r.lag_seconds);
    out->set_replication_bytes_sent(r.bytes_sent);
    out->set_replication_error(r.last_error);
    out->set_replication_pushed_again(r.pushed_again);
  }
  const std::vector<std::string> buddies = Buddies(job, *directory, self);
  const absl::Time now = absl::Now();
  // The job's nodes, and the static peers (no ranks of the job) besides.
  std::map<std::string, std::vector<uint32_t>> nodes = job.peers().Nodes();
  for (const std::string& p : config_.peer.static_peers) nodes.emplace(p, std::vector<uint32_t>());
  for (const auto& [address, ranks] : nodes) {
    v1::JobPeerStatus* p = out->add_peers();
    p->set_address(address);
    for (uint32_t r : ranks) p->add_ranks(r);
    p->set_self(address == self);
    p->set_buddy(std::find(buddies.begin(), buddies.end(), address) != buddies.end());
    p->set_seconds_since_seen(-1);
    if (p->self()) {
      p->set_up(true);
      p->set_seconds_since_seen(0);
      continue;
    }
    if (const auto state = directory->State(address); state.has_value()) {
      p->set_node(state->node);
      p->set_failure_domain(state->failure_domain);
      p->set_up(state->up);
      if (state->last_seen != absl::InfinitePast()) {
        p->set_seconds_since_seen(absl::ToDoubleSeconds(now - state->last_seen));
      }
      p->set_error(state->error);
    }
  }
}

}  // namespace zcc::daemon
