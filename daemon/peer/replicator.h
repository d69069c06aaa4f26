// The peer tier's sender (DESIGN.md 5c): each rank's replicated steps, kept
// in this zccd's replica store as the owner's own copy and pushed to the
// job's buddies, several ranks' steps at once and several files (or parts
// of a large one) at a time on connections of their own (each rank's
// manifest after its files), from
// push threads of its own (and their helpers while a step is pushed), at
// idle priority and within a bandwidth cap. Never on a
// trainer's path: a step still waiting when a newer step of the same rank
// arrives is replaced by it (newest first), and a buddy that is slow or
// gone only makes the lag grow; the push is retried once a newer step or
// the next round comes, to the buddies that have not taken it (one that is
// down keeps it from none of the others). A job that has left this zccd is
// forgotten once its steps are at every buddy, at once when it never knew a
// buddy (nothing could send them), or after gone_job_patience when a buddy
// never took them.
//
// A buddy may drop what it held (its memory goes to a trainer that
// registers there, ReplicaStore::ShrinkTo): every `check_buddies_every` the
// replicator asks each buddy whether it still holds each rank's newest
// replicated step and pushes it again from the owner's copy where one
// dropped it, so that the step is back in two failure domains without
// waiting for the next replicated step.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_REPLICATOR_H_
#define ZCC_DAEMON_PEER_REPLICATOR_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "checkpoint/rank_step_bytes.h"
#include "common/mutex.h"
#include "daemon/peer/call_cancel.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/replica_store.h"
#include "metrics/metrics.h"

namespace zcc::daemon::peer {

class Replicator {
 public:
  // Ranks' steps pushed at once: a node's ranks (push_connections, when
  // fewer, bounds it too).
  static constexpr int kMaxRanksAtOnce = 8;
  struct Options {
    std::string self_node;
    uint64_t bytes_per_s = 0;  // 0: no cap
    absl::Duration push_timeout = absl::Minutes(5);
    // Files pushed to a buddy at a time, of one rank's step or of several
    // ranks' (up to this many ranks' steps are pushed at once, at most
    // kMaxRanksAtOnce), each on a connection of its own; a rank's manifest
    // after its files. One gRPC stream moves 0.4-0.8 GB/s, bound by one
    // core's copies and TLS; 8 of them moved 2.1 GB/s over TLS on a 16-core
    // node (BENCHMARKS.md, "The peer tier's transport"). A rank's step is a
    // few files, most of its bytes in one: the ranks of a node side by side
    // keep the connections busy.
    int push_connections = 8;
    // At most this many bytes of the files under way to a buddy at once,
    // of every rank's push (a piece larger than that goes alone): a buddy
    // holds what arrives beside its replica memory until the pieces are
    // kept. (A file in parts counts its parts here; see part_bytes.)
    uint64_t push_bytes_in_flight = uint64_t{1} << 30;
    // A file larger than this goes to a buddy that takes parts
    // (PeerHelloResponse.takes_parts) in parts of this size side by side, as
    // several files would (0: whole files only). A rank's step is a few
    // files, most of its bytes in its optimizer state's. The buddy holds
    // such a file whole from its first part on: one push at a time sends
    // files in parts to a buddy (the others' whole files go meanwhile).
    uint64_t part_bytes = uint64_t{128} << 20;
    // After a failed round, before the next try of the same step.
    absl::Duration retry_after = absl::Seconds(2);
    // Between two checks that the buddies still hold the newest replicated
    // steps (above); zero or infinite: never.
    absl::Duration check_buddies_every = absl::Seconds(30);
    // A job that has left this zccd with a step not yet at every buddy (one
    // down, or lost with the job's other node): how long that step is tried
    // still before the job is forgotten and its pin lifted (its pieces here
    // then age out with the others' instead of holding the budget for good).
    absl::Duration gone_job_patience = absl::Minutes(10);
    // Counts every byte pushed (zcc_replication_bytes_sent_total); may be null.
    metrics::Counter* bytes_sent = nullptr;
    // Counts every step pushed again (CheckBuddies); may be null.
    metrics::Counter* pushed_again = nullptr;
    // Called on the replicator's thread, without its lock, once a newer step
    // of every local rank of the job is at every buddy (the registry then
    // pins the job's newest whole step in the replica memory,
    // memory_tier.h); may be empty. Calls it makes to peers under `cancel`
    // end when the replicator stops.
    std::function<void(const std::string& job_id, uint32_t uid, CallCancel* cancel)> after_push;
  };
  // Where a job's pieces go now (empty: nowhere yet); nullopt when the job
  // is not on this zccd (any more).
  using BuddiesFn =
      std::function<std::optional<std::vector<std::string>>(const std::string& job_id)>;

  // `store` and `directory` are borrowed and outlive the replicator.
  Replicator(Options options, ReplicaStore* store, PeerDirectory* directory, BuddiesFn buddies);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Keeps `step`'s files (the owner's copy) and queues them for the buddies.
  // An error when the store cannot keep them (the replica budget).
  absl::Status Enqueue(const std::string& job_id, uint32_t uid, checkpoint::RankStepBytes step);

  struct JobStats {
    int64_t newest_step = -1;      // the newest step handed in, of any local rank
    int64_t replicated_step = -1;  // every local rank's files of it at every buddy
    double lag_seconds = 0;        // since the oldest step not yet at every buddy was handed in
    uint64_t bytes_sent = 0;
    std::string last_error;
    // Steps pushed again because a buddy no longer held them.
    uint64_t pushed_again = 0;
  };
  JobStats Stats(const std::string& job_id) const;

  // The job's ranks here went on from a restore of step `restored`, at `at`
  // (their first snapshot after it; Job::GoBack): the steps after it handed
  // in before then are of the run left behind. One waiting is not pushed,
  // one being pushed neither counts as replicated nor fails when it ends,
  // and one replicated no longer counts (nor is checked at the buddies).
  // And the job's buddies are told (WentBack, uid `uid`, on the
  // replicator's thread, a buddy that did not answer again after
  // retry_after, for up to 10 minutes) for the ranks whose steps this
  // replicator pushes: one that runs none of the job's ranks, and so would
  // learn it only from the new run's first push, drops what it holds of
  // their run left at once.
  void WentOn(const std::string& job_id, uint32_t uid, int64_t restored, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The replicator's thread: tells the buddies the goings back due
  // (WentOn). Returns when to try again (InfiniteFuture: none left).
  absl::Time TellWentBack() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls after_push for the job on the replicator's thread soon: a rank's
  // step became whole here with pieces another zccd pushed (the job's
  // newest whole step may have moved on without a push of this zccd's).
  void PinSoon(const std::string& job_id, uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct RankState {
    uint32_t uid = 0;
    // The step waiting (or being pushed), its files by name, manifest last.
    int64_t pending_step = -1;
    std::vector<std::string> pending_files;
    // Counts the steps handed in: a push that ends is of the pending step
    // only where no other was handed in meanwhile (one of the same number,
    // the first after a restore, may be).
    uint64_t pending_gen = 0;
    absl::Time pending_handed_in;
    absl::Time pending_since;
    absl::Time retry_at;  // InfinitePast: now
    bool pushing = false;
    int64_t pushing_step = -1;  // the step being pushed, when pushing
    absl::Time pushing_handed_in;
    // The push in flight is of a run the rank left (a first step after a
    // restore was handed in, or WentOn): when it ends it neither counts as
    // replicated nor as an error.
    bool push_left_behind = false;
    // The next push is the rank's first since it went on from a restore
    // (checkpoint::RankStepBytes::went_on_from); kept until one succeeds.
    int64_t went_on_from = -1;
    int64_t replicated_step = -1;
    std::vector<std::string> replicated_files;  // of replicated_step
    absl::Time replicated_handed_in;
    int64_t newest_step = -1;  // handed in
    // Not empty: the pending step is replicated_step's again, for these
    // buddies only, which no longer held it (CheckBuddies).
    std::vector<std::string> repush_to;
    // The buddies that took the pending step already (a push that failed at
    // another): its retries skip them.
    std::set<std::string> pending_at;
  };
  struct JobState {
    std::map<uint32_t, RankState> ranks;
    uint64_t bytes_sent = 0;
    std::string last_error;
    std::vector<std::string> last_buddies;  // as last known while the job was here
    uint64_t enqueues = 0;  // steps handed in: changed since a look means not gone
    int64_t after_push_step = -1;  // the last step after_push was called for
    uint64_t pushed_again = 0;
    // When the job was first seen gone from this zccd with a step still
    // to push (InfiniteFuture: not seen so).
    absl::Time gone_since = absl::InfiniteFuture();
  };
  using Work = std::pair<std::string, uint32_t>;  // job, rank
  // A rank's step taken for a push (Take), and what Finish needs of it.
  struct Taken {
    Work work;
    uint32_t uid = 0;
    int64_t step = -1;
    std::vector<std::string> files;
    std::vector<std::string> last_buddies;
    std::vector<std::string> only_to;
    int64_t went_on_from = -1;
    uint64_t gen = 0;  // the rank's pending_gen when taken
    absl::Time handed_in;
    std::set<std::string> skip;  // buddies that took the step already
  };
  // The files under way to one buddy, of every push: which of its
  // push_connections connections each holds, and their bytes.
  struct Lanes {
    std::vector<bool> taken;
    uint64_t bytes = 0;
    // A push sending files in parts: the buddy holds each such file whole
    // from its first part on, so one push at a time does (TakeAssembly).
    bool assembling = false;
  };

  // The replicator's thread: the pins after pushes, the buddies' checks,
  // forgetting jobs gone.
  void Run();
  // Each push thread's: the next rank's step due, pushed, and its outcome.
  void PushRanks();
  // The next (job, rank) whose step is due, if any; sets `wait` to when one
  // is due otherwise.
  bool NextWork(Work* work, absl::Duration* wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the rank's pending step as being pushed and returns it.
  Taken Take(const Work& work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank's state after the push of `taken` ended with `pushed` (`took`:
  // the buddies that took it); the job's pin is due (pin_due_) once every
  // local rank's newer step is at every buddy.
  void Finish(const Taken& taken, const absl::Status& pushed, const std::set<std::string>& took,
              uint64_t sent, bool own_missing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank went on from a restore of step `restored`: its steps after it
  // handed in before `before` are of the run left behind (WentOn, and
  // Enqueue of its first step after the restore).
  static void LeaveBehind(JobState& js, RankState& rs, int64_t restored, absl::Time before);
  // Pushes every file of the rank's pending step to every buddy: the job's
  // buddies now, or, once the job has left this zccd, `last_buddies` (known
  // when a step was handed in); to `only_to` instead where not empty; but
  // `skip`. Each buddy that took it goes to `took`; one that failed does
  // not keep the others from it (the first failure is returned).
  // `own_missing`: set when this zccd's copy of a file is gone.
  absl::Status Push(const std::string& job_id, uint32_t uid, uint32_t rank, int64_t step,
                    const std::vector<std::string>& files,
                    const std::vector<std::string>& last_buddies,
                    const std::vector<std::string>& only_to, int64_t went_on_from,
                    const std::set<std::string>& skip, std::set<std::string>* took,
                    uint64_t* sent, bool* own_missing);
  // Forgets the jobs that have left this zccd with nothing left to push,
  // with no buddy ever known (see above), or gone for gone_job_patience with
  // a step not yet at every buddy, and lifts their pins in the store. Asks
  // buddies_ without mu_ held. Returns when to look again (a job kept only
  // for its patience; InfiniteFuture: none).
  absl::Time ForgetGoneJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether CheckBuddies runs at all (check_buddies_every finite, positive).
  bool ChecksBuddies() const {
    return options_.check_buddies_every > absl::ZeroDuration() &&
           options_.check_buddies_every != absl::InfiniteDuration();
  }
  // Asks each job's buddies whether they still hold each rank's newest
  // replicated step, and queues it again where one does not (see above).
  // Calls peers without mu_ held.
  void CheckBuddies() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `files` (their last one after all the others) to `buddy`,
  // options_.push_connections at a time; Push's `sent` and `own_missing`.
  absl::Status PushTo(const std::string& buddy, const std::string& job_id, uint32_t uid,
                      uint32_t rank, int64_t step, const std::vector<std::string>& files,
                      int64_t went_on_from, uint64_t* sent, bool* own_missing)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps as long as the bandwidth cap asks after `bytes` more (or until
  // stop); from any push's thread.
  void Pace(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_, pace_mu_);
  // Waits for a connection to `buddy` free of other files and room for
  // `bytes` among those under way to it (alone when it is larger than the
  // allowance); returns the connection's index (1..push_connections), or
  // -1 once the replicator stops or `give_up` is set (whoever sets it then
  // touches lanes_mu_).
  int TakeLane(const std::string& buddy, uint64_t bytes, const std::atomic<bool>& give_up)
      ABSL_LOCKS_EXCLUDED(lanes_mu_);
  void LeaveLane(const std::string& buddy, int lane, uint64_t bytes) ABSL_LOCKS_EXCLUDED(lanes_mu_);
  // Waits until no other push sends files in parts to `buddy` and takes
  // its turn; false once the replicator stops.
  bool TakeAssembly(const std::string& buddy) ABSL_LOCKS_EXCLUDED(lanes_mu_);
  void LeaveAssembly(const std::string& buddy) ABSL_LOCKS_EXCLUDED(lanes_mu_);

  const Options options_;
  ReplicaStore* const store_;
  PeerDirectory* const directory_;
  const BuddiesFn buddies_;

  // Lock order: mu_ before the store's (ForgetGoneJobs lifts a gone job's
  // pins under mu_); the store calls back (on_pushed_whole, PinSoon) only
  // outside its own lock, so nothing takes them the other way round.
  mutable zcc::Mutex mu_;
  std::map<std::string, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the threads
  uint64_t pushes_ended_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the replicator's thread
  std::set<std::pair<std::string, uint32_t>> pin_due_ ABSL_GUARDED_BY(mu_);  // PinSoon's
  // Each job's going back to tell its buddies (WentOn): the buddies that
  // answered, when to try the others again; `gen` tells a newer one apart.
  struct WentBackTell {
    uint32_t uid = 0;
    int64_t restored = -1;
    absl::Time at;  // when the job's ranks here went on
    std::vector<uint32_t> ranks;  // those ranks: the ones whose steps it pushes
    absl::Time since;  // when WentOn was told it
    std::vector<std::string> last_buddies;  // the job's, as WentOn found them
    std::set<std::string> told;
    absl::Time retry_at;
    uint64_t gen = 0;
  };
  std::map<std::string, WentBackTell> tells_ ABSL_GUARDED_BY(mu_);
  uint64_t tell_gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The push threads and PushTo's helpers, at idle priority like the
  // replicator's thread: a stop puts them back at normal priority too, so
  // that they see it.
  std::set<pthread_t> senders_ ABSL_GUARDED_BY(mu_);
  // The calls of each PushTo under way, ended by a stop (and by the push's
  // own first failure).
  std::set<CallCancel*> push_cancels_ ABSL_GUARDED_BY(mu_);
  // The pace: bytes sent since `pace_start_`, by every push in flight.
  zcc::Mutex pace_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::Time pace_start_ ABSL_GUARDED_BY(pace_mu_) = absl::InfinitePast();
  uint64_t pace_bytes_ ABSL_GUARDED_BY(pace_mu_) = 0;
  // The files under way to each buddy (TakeLane). Never held with mu_.
  zcc::Mutex lanes_mu_;
  std::map<std::string, Lanes> lanes_ ABSL_GUARDED_BY(lanes_mu_);
  bool lanes_closed_ ABSL_GUARDED_BY(lanes_mu_) = false;  // the replicator stops
  // When CheckBuddies is due next (the replicator's thread only).
  absl::Time check_at_ = absl::InfiniteFuture();
  // Ends its calls in flight to peers (a push, after_push's) when the
  // replicator stops.
  CallCancel cancel_;
  std::thread thread_;
  std::vector<std::thread> pushers_;  // PushRanks, joined by the destructor
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_REPLICATOR_H_
