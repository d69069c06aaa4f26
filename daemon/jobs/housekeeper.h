// The registry's background work, on three threads that never wait for one
// another:
//  * heartbeats: writes zccd's heartbeat into every registered rank's segment
//    from a published list of sessions, and touches nothing else, so no
//    commit, write or lock held across one can make a live zccd look dead;
//  * housekeeping: every heartbeat interval, exports skip counts, notices
//    ranks whose trainer is gone, retries or expires pending commits (Job::
//    Tick), republishes the session list and forgets idle jobs;
//  * reaper: retires the ranks housekeeping found dead, one at a time
//    (checkpoint-on-failure, on the rank's writer, then the registration is
//    dropped), so a failure write never holds up other jobs' commits; and
//    lets go of job references (LetGo), so the housekeeping thread never
//    destroys a Job, whose destructor joins the job's committer.
//
// Thread-safety: PublishSessions and Healthy may be called from any thread.
// Ownership: owns its threads (joined by Stop*/the destructor); borrows the
// config and metrics, which outlive it.
#ifndef ZCC_DAEMON_JOBS_HOUSEKEEPER_H_
#define ZCC_DAEMON_JOBS_HOUSEKEEPER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "config/daemon_config.h"
#include "daemon/jobs/job.h"
#include "daemon/rank/rank_session.h"
#include "metrics/metrics.h"

namespace zcc::daemon {

class Housekeeper {
 public:
  // What the housekeeper needs of the registry; each may be called from the
  // housekeeper's threads at any time until StopWork returns.
  struct Registry {
    std::function<std::vector<std::shared_ptr<Job>>()> jobs;  // registered now
    std::function<uint64_t()> staging_bytes;                  // all segments and EMAs
    // Forgets jobs with no rank and nothing pending; returns them.
    std::function<std::vector<std::shared_ptr<Job>>()> drop_idle_jobs;
    // Has the staging pool ask again how much it may hold.
    std::function<void()> recheck_pool;
    // Sets the peer tier's gauges (replication lag, peers up and down).
    std::function<void()> export_peer_metrics;
  };

  Housekeeper(const DaemonConfig& config, metrics::ZccMetrics* metrics, Registry registry);
  ~Housekeeper();
  Housekeeper(const Housekeeper&) = delete;
  Housekeeper& operator=(const Housekeeper&) = delete;

  void Start();
  // Stops housekeeping, then retires the ranks already found dead (their
  // failure writes included). Idempotent.
  void StopWork();
  // Stops the heartbeats (after the ranks were stopped). Idempotent.
  void StopHeartbeats();

  // Makes the heartbeat thread see the sessions of every registered job now.
  void PublishSessions();

  // Retires `session` of `job`, whose trainer is gone: its
  // checkpoint-on-failure, then the session is stopped, removed from the job
  // and its intact snapshots retained (Retain). Without a `caller` the
  // retirement runs here, or, when the session is already being retired or
  // stopped elsewhere, waits for that to finish, at most `wait`. Given one,
  // the retirement runs on the reaper, and this waits for it until the
  // caller's answer is due, never past kMaxRetireWait from the retirement's
  // start. For a trainer that registers again before its predecessor is
  // retired: its registration takes the predecessor's snapshots only once
  // they are retained. False when the caller's time ended the wait with the
  // retirement under way (it has lasted less than kMaxRetireWait).
  struct RetireCaller {
    // When the caller must be answered: the wait wakes then.
    absl::Time answer_by = absl::InfiniteFuture();
    // Whether the caller went away (cancelled): asked once a second, as a
    // synchronous gRPC call's cancellation wakes nothing. May be null.
    std::function<bool()> gone;
  };
  bool RetireNow(const std::shared_ptr<Job>& job, const std::shared_ptr<RankSession>& session,
                 absl::Duration wait, const RetireCaller* caller = nullptr);
  static constexpr absl::Duration kMaxRetireWait = absl::Minutes(10);
  // Keeps the snapshots of `stopped` (removed from `job`) in memory for
  // retain_snapshots, so its rank's next trainer restores them from memory.
  void Retain(Job& job, std::shared_ptr<RankSession> stopped);
  // Lets go of `job` on the reaper thread, where the wait for its committer
  // (when this is the last reference) holds up no housekeeping round, no
  // RPC and no trainer's close. Null is ignored.
  void LetGo(std::shared_ptr<Job> job);
  // False when housekeeping has not completed a round recently (the systemd
  // watchdog stops being fed, and systemd restarts zccd).
  bool Healthy() const;

 private:
  // A rank to retire, or (session null) a job reference to let go of.
  struct Retirement {
    std::shared_ptr<Job> job;
    std::shared_ptr<RankSession> session;
  };
  void HeartbeatLoop();
  void HousekeepingLoop();
  void ReaperLoop();
  void Retire(const Retirement& r);

  const DaemonConfig& config_;
  metrics::ZccMetrics* const metrics_;
  const Registry registry_;
  const absl::Time started_;
  std::atomic<int64_t> last_round_ns_{0};

  // Held to swap the list pointer, for the heartbeat stores (atomics), and to
  // sleep until stopped.
  zcc::Mutex beat_mu_;
  std::shared_ptr<const std::vector<std::shared_ptr<RankSession>>> sessions_
      ABSL_GUARDED_BY(beat_mu_);
  bool beat_stop_ ABSL_GUARDED_BY(beat_mu_) = false;
  std::thread heartbeater_;

  zcc::Mutex work_mu_;  // only to sleep between rounds until stopped
  bool work_stop_ ABSL_GUARDED_BY(work_mu_) = false;
  // Last client-side skip count seen per session (housekeeping thread only).
  std::map<const RankSession*, uint64_t> skipped_seen_;
  std::thread housekeeper_;

  zcc::Mutex reap_mu_;
  std::deque<Retirement> reap_queue_ ABSL_GUARDED_BY(reap_mu_);
  bool reap_stop_ ABSL_GUARDED_BY(reap_mu_) = false;
  std::thread reaper_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_HOUSEKEEPER_H_
