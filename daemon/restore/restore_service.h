// Restore: which step a rank gets back, and reading it. A snapshot the rank's
// previous trainer left in memory (daemon/memory/retained_snapshots.h) is served
// straight from the staging segment the rank adopted, with that trainer's
// EMA. Otherwise the newest committed step whose metadata checks out
// (checkpoint::CheckStepMetadata: COMMITTED, manifests, index, shard sizes
// and headers; no tensor data), or the one asked for, is read into a new
// restore buffer for the rank together with its EMA, each piece read once
// and checked against its checksum as it arrives. A step found damaged while
// it is read is remembered as bad, named in the reply's skipped steps, and
// (when the latest was asked for, or allow_older) the next older one is
// tried; the buffer of a failed read never reaches the trainer. Metadata
// verdicts are cached by step directory and commit hash, so the N ranks of a
// job restoring one step check it once.
//
// Thread-safety: all methods may be called concurrently (one RPC thread per
// restoring rank). Ownership: holds no job or session; the caller keeps them
// alive for the call.
#ifndef ZCC_DAEMON_RESTORE_RESTORE_SERVICE_H_
#define ZCC_DAEMON_RESTORE_RESTORE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "checkpoint/global_index.h"
#include "common/mutex.h"
#include "daemon/jobs/job.h"
#include "daemon/memory/staging_pool.h"
#include "daemon/rank/rank_session.h"
#include "daemon/restore/kept_copies.h"
#include "daemon/restore/restore_prefetch.h"
#include "checkpoint/io_options.h"
#include "daemon/restore/shared_reads.h"
#include "daemon/restore/step_checks.h"
#include "storage/storage.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {

class RestoreService {
 public:
  // Buffers are named "<shm_prefix>.<job>.r<rank>.<what>.g<generation>.<n>";
  // `metrics` is borrowed and outlives the service.
  // Restores read through `storage` (borrowed, outlives the service; null =
  // the default POSIX storage): the daemon's, fault-injecting in drills.
  // Restore buffers come from `pool` (borrowed, outlives the service; null:
  // none) when it has memory ready.
  RestoreService(std::string shm_prefix, uint64_t max_slot_bytes, metrics::ZccMetrics* metrics,
                 storage::Storage* storage = nullptr, StagingPool* pool = nullptr);

  // Restores `session`'s rank of `job` (whose caller was authorised) from the
  // step `req` names, or the newest that reads back intact. Stops with
  // Cancelled at its next check once `cancelled()` is true.
  absl::StatusOr<v1::RestoreResponse> Restore(Job& job, RankSession& session,
                                              const v1::RestoreRequest& req,
                                              const std::function<bool()>& cancelled);

  // Begins reading the step a restore of the newest would choose into a free
  // staging slot of `session` (daemon/restore/restore_prefetch.h), which the session
  // keeps for the restore that usually follows a registration: the first
  // slot, reserved with the registration, while the trainer's snapshots go to
  // the others as their memory is reserved in the background. Only when the
  // session holds no snapshots of a predecessor (a restore would come from
  // memory) and has more than one slot; a job without a committed step frees
  // the slot again at once.
  void StartPrefetch(Job& job, RankSession& session, uint32_t rank);

  // The steps `session`'s rank can restore: held in memory (when they serve
  // a restore with `owned_only`), and committed on disk; newest first.
  absl::StatusOr<v1::RestoreCandidatesResponse> Candidates(Job& job, RankSession& session,
                                                           bool owned_only);

  // Forgets the checks' verdicts on `step_dir` (a step read from the peer
  // tier in place, no longer shown: one written there later is checked
  // afresh).
  void ForgetChecks(const std::string& step_dir) { checks_.Forget(step_dir); }

  // Lets go of the restore buffers other ranks no longer copy from
  // (SharedReads::Expire); every housekeeping round.
  void ExpireSharedReads() { shared_reads_.Expire(); }

  // A fresh shared-memory name for a restore or EMA buffer.
  std::string BufferName(const char* what, const std::string& job_id, uint32_t rank,
                         uint64_t generation);

 private:
  // The held snapshot a restore is served from, if any (call with the job
  // owner's identity).
  std::optional<SlotSnapshot> ServedFromMemory(Job& job, RankSession& session,
                                               const v1::RestoreRequest& req);
  // Serves the snapshot `held` in the session's staging slot.
  v1::RestoreResponse RestoreFromMemory(RankSession& session, const v1::RestoreRequest& req,
                                        const SlotSnapshot& held);
  // Reads committed step `step` (already chosen) for the session's rank into
  // a staging slot or a new restore buffer, or takes over `ahead`'s read of
  // it (may be null), and restores the rank's EMA from it. The caller keeps
  // the step from retention meanwhile (Job::BeginRestore).
  absl::StatusOr<v1::RestoreResponse> RestoreStep(RankSession& session,
                                                  const v1::RestoreRequest& req,
                                                  const std::string& step_dir, int64_t step,
                                                  const std::function<bool()>& cancelled,
                                                  RestorePrefetch* ahead);
  // RestoreStep's read into a staging slot: `ahead`'s (may be null), or into
  // a free slot when the slot holds all that is asked for. Leaves `slot`
  // empty (and reads nothing) when the read needs a buffer of its own; on
  // failure the slot is free again and `slot` empty.
  absl::StatusOr<uint64_t> ReadIntoStaging(RankSession& session, const v1::RestoreRequest& req,
                                           const std::string& step_dir,
                                           const checkpoint::GroupedIndex& index,
                                           const std::function<bool()>& cancelled,
                                           RestorePrefetch* ahead, std::optional<uint32_t>* slot);
  // Reads what `req` asks for into a restore buffer of its own, named
  // `shm_name` (the staging slots cannot hold it); fills the placements of
  // `resp` and hands the buffer's segment to `segment`. Returns bytes read.
  // The buffer is counted in the rank's staging bytes from its creation for
  // as long as `filling` lives (until the caller has it held: Add).
  absl::StatusOr<uint64_t> ReadIntoBuffer(RankSession& session, const v1::RestoreRequest& req,
                                          const std::string& step_dir,
                                          const checkpoint::GroupedIndex& index,
                                          const std::string& shm_name,
                                          const std::function<bool()>& cancelled,
                                          v1::RestoreResponse* resp,
                                          std::optional<shm::Segment>* segment,
                                          std::optional<RestoreBuffers::Filling>* filling);
  // The placements of a restore served from staging slot `slot`.
  void PlaceInSlot(RankSession& session, uint32_t slot, v1::RestoreResponse* resp) const;

  const std::string shm_prefix_;
  const uint64_t max_slot_bytes_;
  metrics::ZccMetrics* const metrics_;
  StagingPool* const pool_;
  // A node-local job's steps in the store, read from this node's kept copy
  // where it has one (kept_copies.h), through the daemon's storage.
  KeptCopies kept_;
  // How restores read their pieces: through kept_.
  const checkpoint::IoOptions read_io_;
  std::atomic<uint64_t> next_buffer_seq_{1};

  // Metadata verdicts and indexes of the steps restores choose from.
  StepChecks checks_;
  // The ranks of a job restoring one step from disk together read each box
  // once between them.
  SharedReads shared_reads_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_RESTORE_SERVICE_H_
