#include "daemon/peer/replicator.h"

#include <algorithm>
#include <map>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "format/checksum.h"

namespace zcc::daemon::peer {

Replicator::Replicator(Options options, ReplicaStore* store, PeerDirectory* directory,
                       BuddiesFn buddies)
    : options_(std::move(options)), store_(store), directory_(directory), buddies_(std::move(buddies)) {
  thread_ = std::thread([this] { Run(); });
  const int pushers = std::clamp(options_.push_connections, 1, kMaxRanksAtOnce);
  pushers_.reserve(pushers);  // (so that only a thread's start can throw below)
  for (int i = 0; i < pushers; ++i) {
    try {
      pushers_.emplace_back([this] { PushRanks(); });
    } catch (const std::system_error& e) {
      if (!pushers_.empty()) {
        ZCC_LOG(WARNING) << "replication: " << i << " push thread(s), not " << pushers << ": "
                         << e.what();
        break;
      }
      {
        zcc::MutexLock lock(&mu_);
        stop_ = true;
      }
      thread_.join();
      throw;
    }
    zcc::MutexLock lock(&mu_);
    senders_.insert(pushers_.back().native_handle());
  }
}

Replicator::~Replicator() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  cancel_.CancelAll();
  {
    zcc::MutexLock lock(&mu_);
    for (CallCancel* push : push_cancels_) push->CancelAll();
  }
  {
    zcc::MutexLock lock(&lanes_mu_);
    lanes_closed_ = true;
  }
  // Its threads run at idle priority: on a busy machine they might wait long
  // for the CPU to see that they must stop.
  {
    zcc::MutexLock lock(&mu_);
    for (pthread_t sender : senders_) LeaveIdlePriority(sender);
  }
  LeaveIdlePriority(thread_.native_handle());
  thread_.join();
  for (std::thread& pusher : pushers_) pusher.join();
}

absl::Status Replicator::Enqueue(const std::string& job_id, uint32_t uid,
                                 checkpoint::RankStepBytes step) {
  if (step.went_on_from >= 0) {
    // Before the own copies of the run left go (the Puts below): a push of
    // them in flight ends as left behind, not as a failure; one waiting is
    // taken back (the first step after the restore takes its place), and
    // the buddies are told at the rank's next push even if this step's
    // Puts fail.
    zcc::MutexLock lock(&mu_);
    JobState& js = jobs_[job_id];
    RankState& rs = js.ranks[step.rank];
    rs.uid = uid;
    rs.went_on_from = step.went_on_from;
    LeaveBehind(js, rs, step.went_on_from, absl::InfiniteFuture());
  }
  std::vector<std::string> names;
  for (checkpoint::RankStepFile& f : step.files) {
    Replica r;
    r.info.key = ReplicaKey{job_id, uid, step.rank, step.step, f.name};
    r.info.xxh3 = format::Xxh3(f.bytes.data(), f.bytes.size());
    r.info.from_node = options_.self_node;
    r.info.own = true;
    r.info.received = absl::Now();
    r.bytes = std::move(f.bytes);
    if (absl::Status st = store_->Put(std::move(r), step.went_on_from); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("keeping step ", step.step, " of rank ",
                                                  step.rank, " for the peer tier: ", st.message()));
    }
    names.push_back(f.name);
  }
  // Where the job's pieces go now: kept for a push after the job has left
  // this zccd (a trainer that closes right after its last step).
  std::optional<std::vector<std::string>> buddies = buddies_(job_id);
  zcc::MutexLock lock(&mu_);
  JobState& js = jobs_[job_id];
  ++js.enqueues;
  js.gone_since = absl::InfiniteFuture();  // (here, or here again)
  if (buddies.has_value() && !buddies->empty()) js.last_buddies = *std::move(buddies);
  RankState& rs = js.ranks[step.rank];
  rs.uid = uid;
  if (step.went_on_from >= 0) {
    // (Again: a buddy check's push of an older step may have taken it
    // while the own copies were kept.)
    rs.went_on_from = step.went_on_from;
  } else if (step.step <= rs.pending_step && rs.pushing) {
    return absl::OkStatus();
  }
  if (step.step < rs.replicated_step) {
    // The rank went back (it restored an older step) and says so only now:
    // what the buddies hold is of the steps it left behind.
    rs.replicated_step = -1;
    rs.replicated_files.clear();
    rs.newest_step = -1;
    js.after_push_step = -1;  // (the job's pin is looked at again for this run's steps)
  }
  rs.newest_step = std::max(rs.newest_step, step.step);
  rs.repush_to.clear();  // (the new step goes to every buddy)
  if (rs.pending_step < 0 || rs.pending_step == rs.replicated_step) rs.pending_since = absl::Now();
  rs.pending_step = step.step;
  rs.pending_files = std::move(names);
  rs.pending_at.clear();
  ++rs.pending_gen;
  rs.pending_handed_in = absl::Now();
  rs.retry_at = absl::InfinitePast();
  ++enqueued_;
  return absl::OkStatus();
}

bool Replicator::NextWork(Work* work, absl::Duration* wait) {
  const absl::Time now = absl::Now();
  absl::Time soonest = absl::InfiniteFuture();
  // Of the ranks due, the one waiting longest: a rank whose steps keep
  // coming does not starve the others.
  const RankState* chosen = nullptr;
  for (auto& [job_id, js] : jobs_) {
    for (auto& [rank, rs] : js.ranks) {
      if (rs.pushing || rs.pending_step < 0 || rs.pending_step == rs.replicated_step) continue;
      if (rs.retry_at <= now) {
        if (chosen == nullptr || rs.pending_since < chosen->pending_since) {
          chosen = &rs;
          *work = {job_id, rank};
        }
        continue;
      }
      soonest = std::min(soonest, rs.retry_at);
    }
  }
  if (chosen != nullptr) return true;
  *wait = soonest == absl::InfiniteFuture() ? absl::InfiniteDuration() : soonest - now;
  return false;
}

absl::Time Replicator::ForgetGoneJobs() {
  std::vector<std::pair<std::string, uint64_t>> idle;  // no push in progress; its enqueues
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [job_id, js] : jobs_) {
      bool pushing = false;
      for (const auto& [rank, rs] : js.ranks) pushing = pushing || rs.pushing;
      if (!pushing) idle.emplace_back(job_id, js.enqueues);
    }
  }
  absl::Time again = absl::InfiniteFuture();
  const absl::Time now = absl::Now();
  for (const auto& [job_id, enqueues] : idle) {
    if (buddies_(job_id).has_value()) continue;  // still on this zccd
    zcc::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    // (A step handed in since: the job came back.)
    if (it == jobs_.end() || it->second.enqueues != enqueues) continue;
    JobState& js = it->second;
    bool pending = false;
    bool pushing = false;
    for (const auto& [rank, rs] : js.ranks) {
      // (A step pushed again to a buddy that dropped it does not keep a
      // job that has left.)
      pending = pending || (rs.pending_step >= 0 && rs.pending_step != rs.replicated_step &&
                            rs.repush_to.empty());
      pushing = pushing || rs.pushing;
    }
    if (pushing) continue;
    if (pending && !js.last_buddies.empty()) {
      // Its steps go to the buddies it last knew, for a while: one that
      // stays down (lost with the job's other node) must not keep the job,
      // its pin and its own copies here for as long as zccd runs.
      if (js.gone_since == absl::InfiniteFuture()) js.gone_since = now;
      const absl::Time give_up = js.gone_since + options_.gone_job_patience;
      if (now < give_up) {
        again = std::min(again, give_up);
        continue;
      }
      ZCC_LOG(WARNING) << "job " << job_id << " left this zccd "
                       << absl::FormatDuration(now - js.gone_since) << " ago and its newest "
                       << "steps could not reach every buddy since (" << js.last_error
                       << "): given up; they are not replicated";
    } else if (pending) {
      ZCC_LOG(WARNING) << "job " << job_id << " left this zccd before any buddy was known: its "
                       << "newest steps are not replicated";
    }
    // Its pieces here age out with the others' from now on (a pin would
    // hold them, and the budget, for good).
    std::set<uint32_t> uids;
    for (const auto& [rank, rs] : js.ranks) uids.insert(rs.uid);
    for (uint32_t uid : uids) store_->Pin(job_id, uid, -1);
    jobs_.erase(it);
  }
  return again;
}

void Replicator::PinSoon(const std::string& job_id, uint32_t uid) {
  zcc::MutexLock lock(&mu_);
  pin_due_.insert({job_id, uid});
  ++enqueued_;
}

void Replicator::Run() {
  // Replication never competes with training for the CPU.
  MakeThisThreadIdle();
  const bool checks = ChecksBuddies();
  if (checks) check_at_ = absl::Now() + options_.check_buddies_every;
  for (;;) {
    // As of before the look at the jobs below: a step handed in or a push
    // that ended during it (a job may have gone) wakes the wait after it.
    uint64_t enqueued, ended;
    {
      zcc::MutexLock lock(&mu_);
      enqueued = enqueued_;
      ended = pushes_ended_;
    }
    const absl::Time forget_at = ForgetGoneJobs();
    if (checks && absl::Now() >= check_at_) {
      CheckBuddies();
      check_at_ = absl::Now() + options_.check_buddies_every;
    }
    const absl::Time tell_at = TellWentBack();
    std::set<std::pair<std::string, uint32_t>> pins;
    {
      zcc::MutexLock lock(&mu_);
      // Woken by a step handed in or a push that ended, a going back to
      // tell (WentOn), a pin due, the buddies' check or a tell tried again,
      // a stop.
      auto woken = [this, enqueued, ended]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !pin_due_.empty() || enqueued_ != enqueued || pushes_ended_ != ended;
      };
      mu_.AwaitWithTimeout(absl::Condition(&woken),
                           std::min({check_at_, tell_at, forget_at}) - absl::Now());
      if (stop_) return;
      pins.swap(pin_due_);
    }
    if (options_.after_push) {
      for (const auto& [job_id, job_uid] : pins) options_.after_push(job_id, job_uid, &cancel_);
    }
  }
}

void Replicator::PushRanks() {
  MakeThisThreadIdle();
  for (;;) {
    Taken taken;
    {
      zcc::MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        Work work;
        absl::Duration wait;
        if (NextWork(&work, &wait)) {
          taken = Take(work);
          break;
        }
        const uint64_t seen = enqueued_;
        auto woken = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || enqueued_ != seen;
        };
        mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
      }
    }
    uint64_t sent = 0;
    bool own_missing = false;
    std::set<std::string> took;
    const absl::Time began = absl::Now();
    const absl::Status pushed =
        Push(taken.work.first, taken.uid, taken.work.second, taken.step, taken.files,
             taken.last_buddies, taken.only_to, taken.went_on_from, taken.skip, &took, &sent,
             &own_missing);
    if (options_.bytes_sent != nullptr) options_.bytes_sent->Increment(sent);
    if (pushed.ok()) {
      const double s = absl::ToDoubleSeconds(absl::Now() - began);
      ZCC_LOG(INFO) << "replicated job=" << taken.work.first << " rank=" << taken.work.second
                    << " step=" << taken.step << " bytes=" << sent << " seconds=" << s
                    << " GB/s=" << (s > 0 ? sent / s / 1e9 : 0.0);
    }
    zcc::MutexLock lock(&mu_);
    Finish(taken, pushed, took, sent, own_missing);
    ++pushes_ended_;
    ++enqueued_;  // (a retry of the rank may be due at a new time: the push threads look again)
  }
}

Replicator::Taken Replicator::Take(const Work& work) {
  JobState& js = jobs_[work.first];
  RankState& rs = js.ranks[work.second];
  Taken taken;
  taken.work = work;
  rs.pushing = true;
  taken.uid = rs.uid;
  taken.step = rs.pending_step;
  taken.files = rs.pending_files;
  taken.last_buddies = js.last_buddies;
  taken.only_to = rs.repush_to;
  // (Only with a step after the restore: a buddy check's push of an older
  // step, taken before Enqueue kept the first step after it, would drop
  // the rank's newer steps at the buddy, the one restored among them.)
  taken.went_on_from = rs.pending_step > rs.went_on_from ? std::exchange(rs.went_on_from, -1) : -1;
  taken.gen = rs.pending_gen;
  taken.handed_in = rs.pending_handed_in;
  taken.skip = rs.pending_at;
  rs.pushing_step = taken.step;
  rs.pushing_handed_in = taken.handed_in;
  rs.push_left_behind = false;
  return taken;
}

void Replicator::Finish(const Taken& taken, const absl::Status& pushed,
                        const std::set<std::string>& took, uint64_t sent, bool own_missing) {
  const auto& [job_id, rank] = taken.work;
  JobState& js = jobs_[job_id];
  RankState& rs = js.ranks[rank];
  rs.pushing = false;
  js.bytes_sent += sent;
  const bool same_hand_in = rs.pending_gen == taken.gen;
  if (std::exchange(rs.push_left_behind, false)) {
    if (same_hand_in) {
      rs.pending_step = rs.replicated_step;  // at rest (none: -1)
      rs.pending_files.clear();
      rs.repush_to.clear();
      rs.pending_at.clear();
    }
    ZCC_LOG(INFO) << "job " << job_id << " rank " << rank << ": step " << taken.step
                  << " is of the run left behind (the rank went on from an older step): "
                  << (pushed.ok() ? "its push ended, not counted" : "its push ended early");
  } else if (pushed.ok()) {
    // (The first step after a restore replaces a newer one of the run
    // it left, whose push ended after it was handed in.)
    if (taken.step >= rs.replicated_step || taken.went_on_from >= 0) {
      rs.replicated_step = taken.step;
      rs.replicated_files = taken.files;
      rs.replicated_handed_in = taken.handed_in;
    }
    if (same_hand_in) {
      rs.pending_files.clear();
      rs.repush_to.clear();
      rs.pending_at.clear();
    } else {
      rs.pending_since = absl::Now();  // another step came meanwhile
    }
    js.last_error.clear();
    // Once per step that every local rank has at every buddy: the
    // replicator's thread pins it.
    int64_t everywhere = INT64_MAX;
    for (const auto& [r, state] : js.ranks) {
      everywhere = std::min(everywhere, state.replicated_step);
    }
    if (everywhere > js.after_push_step) {
      js.after_push_step = everywhere;
      pin_due_.insert({job_id, taken.uid});
    }
  } else {
    js.last_error = std::string(pushed.message());
    // The next push of the rank still tells its buddies.
    if (rs.went_on_from < 0) rs.went_on_from = taken.went_on_from;
    if (same_hand_in && own_missing) {
      // Nothing to push it from: the rank's next step goes in its place.
      rs.pending_step = -1;
      rs.pending_files.clear();
      rs.repush_to.clear();
      rs.pending_at.clear();
    } else if (same_hand_in) {
      rs.pending_at.insert(took.begin(), took.end());  // (its retries skip them)
      // A buddy that dropped a step mostly did for want of room: it is
      // tried again at the next check, not every retry_after.
      const bool repush = !rs.repush_to.empty() && ChecksBuddies();
      rs.retry_at = absl::Now() + (repush ? std::max(options_.check_buddies_every,
                                                      options_.retry_after)
                                          : options_.retry_after);
    }
    ZCC_LOG(WARNING) << "job " << job_id << " rank " << rank << ": step " << taken.step
                     << " not replicated yet: " << pushed;
  }
}

void Replicator::LeaveBehind(JobState& js, RankState& rs, int64_t restored, absl::Time before) {
  // A push of it in flight ends as left behind (neither replicated nor a
  // failure), one waiting is taken back, one replicated no longer counts.
  if (rs.pushing && rs.pushing_step > restored && rs.pushing_handed_in < before) {
    rs.push_left_behind = true;
  }
  if (rs.replicated_step > restored && rs.replicated_handed_in < before) {
    rs.replicated_step = -1;
    rs.replicated_files.clear();
  }
  if (rs.pending_step > restored && rs.pending_handed_in < before) {
    rs.pending_step = rs.replicated_step;  // at rest (none: -1)
    rs.pending_files.clear();
    rs.repush_to.clear();
    rs.pending_at.clear();
  }
  if (rs.newest_step > restored) rs.newest_step = std::max(rs.replicated_step, rs.pending_step);
  // (The job's pin is looked at again for the new run's steps.)
  if (js.after_push_step > restored) js.after_push_step = -1;
}

void Replicator::WentOn(const std::string& job_id, uint32_t uid, int64_t restored,
                        absl::Time at) {
  zcc::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  // (No step of the job pushed from here: nothing of it at the buddies is
  // this zccd's to tell.)
  if (job == jobs_.end() || job->second.ranks.empty()) return;
  WentBackTell& tell = tells_[job_id];
  tell = WentBackTell{uid, restored, at, {}, absl::Now(), job->second.last_buddies, {},
                      absl::InfinitePast(), ++tell_gen_};
  for (auto& [rank, rs] : job->second.ranks) {
    tell.ranks.push_back(rank);
    LeaveBehind(job->second, rs, restored, at);
  }
  ++enqueued_;  // (wakes the replicator's thread)
}

absl::Time Replicator::TellWentBack() {
  // A buddy that has not answered by then may have restarted (its memory
  // empty) or been replaced: the new run's pushes reach it as they go.
  constexpr absl::Duration kTellFor = absl::Minutes(10);
  std::vector<std::pair<std::string, WentBackTell>> due;
  absl::Time next = absl::InfiniteFuture();
  {
    zcc::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = tells_.begin(); it != tells_.end();) {
      if (now - it->second.since > kTellFor) {
        ZCC_LOG(WARNING) << "job " << it->first << ": gave up telling its buddies that it went on "
                         << "from step " << it->second.restored << " (" << it->second.told.size()
                         << " answered)";
        it = tells_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [job_id, tell] : tells_) {
      if (tell.retry_at <= now) {
        due.emplace_back(job_id, tell);
      } else {
        next = std::min(next, tell.retry_at);
      }
    }
  }
  for (auto& [job_id, tell] : due) {
    const std::vector<std::string> buddies = buddies_(job_id).value_or(tell.last_buddies);
    bool all = true;
    for (const std::string& buddy : buddies) {
      if (tell.told.count(buddy) > 0) continue;
      const std::optional<PeerState> state = directory_->State(buddy);
      if (state.has_value() && state->probed && !state->up) {  // (told once it is up)
        all = false;
        continue;
      }
      const absl::StatusOr<bool> applied =
          directory_->Client(buddy)->WentBack(job_id, tell.uid, tell.restored, tell.ranks,
                                              absl::Now() - tell.at, absl::Seconds(3), &cancel_);
      if (applied.ok() || absl::IsUnimplemented(applied.status())) {  // (a zccd too old to)
        tell.told.insert(buddy);
        if (applied.ok() && *applied) {
          ZCC_LOG(INFO) << "job " << job_id << ": told " << buddy << " that it went on from step "
                        << tell.restored << " (it runs none of the job's ranks)";
        }
      } else {
        all = false;
        if (absl::IsCancelled(applied.status())) break;  // (zccd stops)
        ZCC_LOG(WARNING) << "job " << job_id << ": could not tell " << buddy << " that it went "
                         << "on from step " << tell.restored << " (tried again in "
                         << absl::FormatDuration(options_.retry_after) << "): "
                         << applied.status();
      }
    }
    zcc::MutexLock lock(&mu_);
    auto it = tells_.find(job_id);
    if (it == tells_.end() || it->second.gen != tell.gen) continue;  // (a newer one)
    if (all) {
      tells_.erase(it);
      continue;
    }
    it->second.told = std::move(tell.told);
    it->second.retry_at = absl::Now() + options_.retry_after;
    next = std::min(next, it->second.retry_at);
  }
  return next;
}

void Replicator::CheckBuddies() {
  struct Settled {
    std::string job_id;
    uint32_t uid;
    uint32_t rank;
    int64_t step;
    std::vector<std::string> files;
    std::vector<std::string> last_buddies;
  };
  std::vector<Settled> settled;
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [job_id, js] : jobs_) {
      for (const auto& [rank, rs] : js.ranks) {
        // Only a step at rest: one being pushed, or with a newer one
        // waiting, is the push's business.
        if (rs.pushing || rs.replicated_step < 0 || rs.pending_step != rs.replicated_step ||
            rs.replicated_files.empty()) {
          continue;
        }
        settled.push_back({job_id, rs.uid, rank, rs.replicated_step, rs.replicated_files,
                           js.last_buddies});
      }
    }
  }
  // What each buddy holds of each (job, uid), asked once a round; a buddy
  // that could not be asked is passed over for the round (nothing here can
  // tell what it holds; the peer directory says whether it is up).
  std::map<std::tuple<std::string, uint32_t, std::string>, std::map<ReplicaKey, ReplicaInfo>> holds;
  std::set<std::string> unreachable;
  for (const Settled& s : settled) {
    // This zccd's copy: what the buddies' pieces must match, and what a
    // step is pushed again from.
    std::map<std::string, ReplicaInfo> own;
    for (const std::string& name : s.files) {
      auto piece = store_->Get(ReplicaKey{s.job_id, s.uid, s.rank, s.step, name});
      if (piece.ok()) own[name] = (*piece)->info;
    }
    std::vector<std::string> dropped_by;
    for (const std::string& buddy : buddies_(s.job_id).value_or(s.last_buddies)) {
      {
        zcc::MutexLock lock(&mu_);
        if (stop_) return;
      }
      if (unreachable.count(buddy) > 0) continue;
      auto found = holds.find({s.job_id, s.uid, buddy});
      if (found == holds.end()) {
        // (One its probes found down is not waited for: the push's own
        // retries see to it once it is back.)
        const std::optional<PeerState> state = directory_->State(buddy);
        if (state.has_value() && state->probed && !state->up) {
          unreachable.insert(buddy);
          continue;
        }
        auto listed = directory_->Client(buddy)->List(s.job_id, s.uid, absl::Seconds(5), &cancel_);
        if (!listed.ok()) {
          ZCC_LOG(WARNING) << "job " << s.job_id << ": cannot ask buddy " << buddy
                           << " what it still holds: " << listed.status();
          unreachable.insert(buddy);
          continue;
        }
        found = holds.try_emplace({s.job_id, s.uid, buddy}).first;
        for (ReplicaInfo& info : *listed) found->second.emplace(info.key, std::move(info));
      }
      for (const std::string& name : s.files) {
        auto held = found->second.find(ReplicaKey{s.job_id, s.uid, s.rank, s.step, name});
        auto mine = own.find(name);
        // Held under the name with other bytes (another run's) counts as gone.
        if (held == found->second.end() ||
            (mine != own.end() && (held->second.nbytes != mine->second.nbytes ||
                                   held->second.xxh3 != mine->second.xxh3))) {
          dropped_by.push_back(buddy);
          break;
        }
      }
    }
    if (dropped_by.empty()) continue;
    const bool own_copy = own.size() == s.files.size();
    zcc::MutexLock lock(&mu_);
    auto job = jobs_.find(s.job_id);
    if (job == jobs_.end()) continue;
    JobState& js = job->second;
    RankState& rs = js.ranks[s.rank];
    if (rs.pushing || rs.replicated_step != s.step || rs.pending_step != s.step) continue;  // moved on
    // Not at every buddy any more (the last step that is, if any, is not known).
    rs.replicated_step = -1;
    rs.replicated_files.clear();
    rs.pending_since = absl::Now();
    const std::string what =
        absl::StrCat(dropped_by.size() == 1 ? "buddy " : "buddies ", absl::StrJoin(dropped_by, ", "),
                     " no longer hold", dropped_by.size() == 1 ? "s" : "", " step ", s.step,
                     " of rank ", s.rank, " (its memory went to a trainer there, or it restarted)");
    if (own_copy) {
      rs.pending_files = s.files;
      rs.repush_to = std::move(dropped_by);
      rs.pending_at.clear();
      rs.retry_at = absl::InfinitePast();
      ++enqueued_;  // (the push threads look again)
      js.after_push_step = -1;  // the job's pin is looked at again once it is back
      ++js.pushed_again;
      if (options_.pushed_again != nullptr) options_.pushed_again->Increment(1);
      js.last_error = absl::StrCat(what, ": pushing it again");
    } else {
      // Nothing to push it from: the rank's next replicated step goes to
      // every buddy in its place.
      rs.pending_step = -1;
      rs.pending_files.clear();
      rs.pending_at.clear();
      js.last_error = absl::StrCat(what, ", and this zccd's copy is gone too: not pushed again; "
                                   "the rank's next replicated step goes in its place");
    }
    ZCC_LOG(WARNING) << "job " << s.job_id << " rank " << s.rank << ": " << js.last_error;
  }
}

Replicator::JobStats Replicator::Stats(const std::string& job_id) const {
  JobStats out;
  zcc::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return out;
  const absl::Time now = absl::Now();
  bool first = true;
  for (const auto& [rank, rs] : it->second.ranks) {
    out.newest_step = std::max(out.newest_step, rs.newest_step);
    out.replicated_step = first ? rs.replicated_step : std::min(out.replicated_step, rs.replicated_step);
    first = false;
    if (rs.newest_step > rs.replicated_step) {
      out.lag_seconds = std::max(out.lag_seconds, absl::ToDoubleSeconds(now - rs.pending_since));
    }
  }
  out.bytes_sent = it->second.bytes_sent;
  out.last_error = it->second.last_error;
  out.pushed_again = it->second.pushed_again;
  return out;
}

}  // namespace zcc::daemon::peer
