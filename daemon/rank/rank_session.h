// One registered trainer rank: its lifecycle and the ingest thread that turns
// READY slots into EMA updates and writes. What it is made of has owners of
// its own: the staging slots (daemon/rank/staging_slots.h), the EMA
// (daemon/rank/rank_ema.h), the writer (daemon/rank/rank_writer.h) and what it holds
// from the previous trainer (daemon/rank/held_snapshots.h).
//
// Ingest: a dedicated thread sleeps on the segment's doorbell futex, takes
// READY slots in publication order (kReady -> kIngesting), folds them into
// the EMA (daemon/rank/rank_ema.h) and frees them (-> kFree, free bell). A slot
// whose step is due (every `save_every` steps, or after RequestSave) goes to
// the rank's writer (daemon/rank/rank_writer.h) instead, with a copy of the EMA as
// of that step, and stays kIngesting until its shards are written. Meanwhile
// ingest goes on with the other slots, so a checkpoint being written stalls
// neither the trainer nor the EMA as long as one slot is free; one write runs
// per rank at a time (a step that falls due while the previous write still
// runs waits for it). One slow disk therefore only holds up its own rank.
// Every word read from shared memory is validated.
//
// Restore from memory: when a trainer dies or exits, its stopped session is
// kept for a while (daemon/memory/retained_snapshots.h) with the FULL snapshots
// still intact in its staging segment. A trainer of the same rank that
// registers again with the same tensors gets a session that adopts that
// segment: the snapshots stay in their slots, held (kIngesting) until the
// trainer has restored (RestoreDone) or publishes a snapshot of its own, and
// the predecessor's EMA goes to the new session when one of them is restored.
//
// Thread-safety: all public methods may be called from any thread.
// Ownership: owns the segment (removed when the session is destroyed).
#ifndef ZCC_DAEMON_RANK_RANK_SESSION_H_
#define ZCC_DAEMON_RANK_RANK_SESSION_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/io_options.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/rank_step_bytes.h"
#include "checkpoint/shard_writer.h"
#include "common/fs_identity.h"
#include "cuda/ipc_puller.h"
#include "common/mutex.h"
#include "daemon/rank/held_snapshots.h"
#include "daemon/rank/rank_ema.h"
#include "daemon/rank/rank_writer.h"
#include "daemon/rank/registered_tensor.h"
#include "daemon/restore/restore_buffers.h"
#include "daemon/restore/restore_prefetch.h"
#include "daemon/rank/staging_slots.h"
#include "ema/ema_updater.h"
#include "format/dtype.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"
#include "storage/aligned_buffer.h"

namespace zcc::daemon {

struct RankSessionOptions {
  std::string job_dir;
  uint32_t num_slots = 2;
  uint32_t save_every = 0;  // 0 = persist only on request
  bool persist_on_failure = false;
  int32_t pid = 0;
  metrics::ZccMetrics* metrics = nullptr;  // borrowed; outlives the session
  uint32_t ema_interval = 1;  // EMA every N-th snapshotted step (0 = every step)
  uint64_t generation = 0;
  // The registering client's RegisterRequest.client_instance (0: none).
  uint64_t client_instance = 0;
  // Owner of every segment this rank's client maps (staging, restore and EMA
  // buffers): the trainer's uid when zccd runs as root, -1 (zccd's own)
  // otherwise.
  uid_t segment_owner = static_cast<uid_t>(-1);
  // The job's owner, whose file-system identity writes the shards.
  FsOwner fs_owner;
  // How shards are written (tests pass a slow or faulty storage).
  checkpoint::IoOptions io;
  // zccd's writer threads (borrowed, outlive the session); null: a thread of
  // the session's own (tests).
  TaskPool* write_pool = nullptr;
  // The peer tier: every `replicate_every`-th full snapshot (0 = none) is
  // serialized and handed to `on_replicate`, when the writer is free (a step
  // that finds it writing is not replicated: the lag shows, the trainer
  // never waits; the newest full snapshot goes in its place as soon as the
  // writer is free).
  uint32_t replicate_every = 0;
  std::function<void(checkpoint::RankStepBytes)> on_replicate;
  // The trainer went on from the step a restore served it (NoteRestored):
  // told once, from the ingest thread, at its first snapshot of a later
  // step, with the restored step, that snapshot's, and whether the restore
  // read the step from a directory (disk or store; not from memory). Null:
  // nobody is told.
  std::function<void(int64_t restored, int64_t step, bool from_disk)> on_trained_on;
  // The timeline of the run the session's snapshots belong to until a
  // restore names another (format::RankManifest::timeline; empty: none).
  std::string timeline;
  // Tests: called with each slot's index as a scan for published slots
  // reads it (shm::SlotRing::Ready's after_read), on the thread ingesting.
  std::function<void(uint32_t)> after_slot_read;
};

struct RankCounters {
  int64_t last_snapshot_step = -1;
  int64_t last_persisted_step = -1;
  int64_t last_ema_step = -1;
  uint64_t ema_skipped_nonfinite = 0;
  uint64_t ema_out_of_order = 0;  // taken in after a later one: lost to the EMA
  uint64_t ema_tensors = 0;
  uint64_t snapshots_ingested = 0;
  uint64_t snapshots_skipped = 0;   // as counted by the client
  uint64_t persist_failures = 0;
  uint32_t slots_in_use = 0;
  uint64_t replications_skipped = 0;  // due peer-tier steps left out
  bool client_alive = true;
  std::string last_error;
  // Daemon-pull only.
  bool daemon_pull = false;
  PullerStats pulls;
};

class RankSession {
 public:
  // `shards` describes the staged tensors (what this rank writes);
  // `registered` every tensor the trainer registered, in its order.
  // `ema` (may be null) keeps the EMA of the tensors `registered[ema_index[i]]`
  // (staged parameters).
  RankSession(checkpoint::RankShards shards, std::vector<RegisteredTensor> registered,
              shm::Segment segment, RankSessionOptions options, PersistCallback on_persisted,
              std::unique_ptr<ema::EmaUpdater> ema = nullptr, std::vector<size_t> ema_index = {},
              Inheritance inherited = {});
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  void Start();
  // Daemon-pull: `puller` serves this session's channel until Stop(). Call
  // before Start().
  void AttachPuller(std::unique_ptr<RankPuller> puller);
  // The slots `slots`, held back (SlotRing::HoldBack), get their memory
  // reserved on a thread of their own after Start() and are then freed for
  // the client: registering costs the reservation of one slot, not of all.
  // A slot whose memory cannot be had stays held back (logged, last_error).
  // Call before Start().
  void ReserveInBackground(std::vector<uint32_t> slots);

  // The staging segment and its slots.
  StagingSlots& slots() { return slots_; }
  const StagingSlots& slots() const { return slots_; }
  // Ingests what is already READY, finishes the write in progress, stops the
  // threads and tells the client the registration is closed. Idempotent.
  void Stop();

  // Persist the next FULL snapshot regardless of save_every.
  void RequestSave() { save_requested_.store(true); }

  // The trainer is gone: ingests what it published, then persists its newest
  // complete FULL snapshot if that is newer than the last persisted step and
  // its slot was not taken again (a slot the trainer was filling when it died
  // is never used). Call before Stop(); returns the step persisted, if any.
  std::optional<int64_t> PersistNewestOnFailure();

  // The trainer is gone: if a due replication step was left out (the
  // replication writer was busy) and no later snapshot went in its place,
  // serializes the newest complete FULL snapshot for the peer tier now,
  // waiting for the writer, so that the job's last due step is not lost
  // with the node. Call before Stop(); returns the step handed over, if any.
  std::optional<int64_t> ReplicateOwed();

  // A restore served `step` to this rank's trainer (read from a directory
  // when `from_disk`): its first snapshot of a later step tells
  // options().on_trained_on. Its snapshots of later steps from now on
  // belong to `step_timeline` where given (the timeline of the step read
  // from a directory: a rank restoring alone goes on in it), else to the
  // one they belonged to.
  void NoteRestored(int64_t step, bool from_disk = false,
                    const std::optional<std::string>& step_timeline = std::nullopt)
      ABSL_LOCKS_EXCLUDED(timeline_mu_);
  // The ranks restored together and every one has the step: its snapshots of
  // later steps belong to `timeline` (RestoreDoneRequest.timeline).
  void AdoptTimeline(const std::string& timeline) ABSL_LOCKS_EXCLUDED(timeline_mu_);
  // The timeline a snapshot of `step` published now belongs to (INT64_MAX:
  // the one the trainer goes on in).
  std::string Timeline(int64_t step) const ABSL_LOCKS_EXCLUDED(timeline_mu_);

  // Writes `held` (an intact snapshot of this stopped session, as
  // RetainedSnapshots keeps it) into `job_dir` as a checkpoint write of its
  // step does, straight from the slot with the session's I/O, with the EMA
  // when `with_ema` (the caller checks ema_step() is the snapshot's).
  absl::StatusOr<checkpoint::WriteStats> WriteRetained(const SlotSnapshot& held,
                                                       const std::string& job_dir, bool with_ema);

  // True for the first caller only: that caller stops this session and lets
  // it go (retires it: its trainer is gone or gave it up; unregisters it;
  // replaces it), so that two of these never run on one session.
  bool BeginRetirement() {
    int64_t none = 0;  // (the first caller's time, set before anyone sees retiring_)
    retiring_since_ns_.compare_exchange_strong(none, absl::GetCurrentTimeNanos());
    return !retiring_.exchange(true);
  }
  // When the first BeginRetirement was called (InfinitePast: never).
  absl::Time RetiringSince() const {
    const int64_t ns = retiring_since_ns_.load();
    return ns == 0 ? absl::InfinitePast() : absl::FromUnixNanos(ns);
  }

  // Daemon heartbeat into the control block; called periodically.
  void Heartbeat();
  // False once the trainer's heartbeat is older than `timeout` (measured from
  // registration until the first heartbeat).
  bool ClientAlive(absl::Duration timeout) const;
  // True when the registering process is known to be gone. Only answers true
  // when the pid was visible to the daemon at registration (same pid
  // namespace); otherwise liveness rests on heartbeats alone.
  bool ClientProcessGone() const;
  // True once zccd found its staging segment cut short (the trainer, which
  // owns the object, truncated it): zccd's mapping holds zeros from then on
  // (shm/truncation_guard.h), and nothing more of this rank is taken.
  bool SegmentCut() const { return slots_.cut(); }

  // The restore and EMA buffers filled for this rank's client, kept until it
  // has copied them out; dropped when the session stops.
  RestoreBuffers& restore_buffers() { return restore_buffers_; }

  const checkpoint::RankShards& shards() const { return shards_; }
  const std::vector<RegisteredTensor>& registered() const { return registered_; }

  // Copies the current EMA into a new segment `shm_name` (kept as a restore
  // buffer until the client releases it), once it has folded in `min_step`
  // or a newer one or `deadline` passed (min_step < 0: at once).
  // FailedPrecondition without an EMA.
  absl::StatusOr<v1::ReadEmaResponse> CopyEma(const std::string& shm_name, int64_t min_step = -1,
                                              absl::Time deadline = absl::InfinitePast());

  // Ends the waits of requests (a ReadEma for a step), now and later.
  void InterruptWaits() { ema_.Interrupt(); }

  // A restored checkpoint's "ema" tensors (any rank's shards), read through
  // `storage` (the restore's, which the step's other files came through: a
  // kept copy, a step read from the peer tier) until `cancelled` (null:
  // never), beside the read of the step's other tensors; InstallEma sets the
  // EMA to them once the whole step is read. Nothing to install without an
  // EMA, or from a checkpoint without EMA tensors (the EMA starts afresh,
  // logged).
  absl::StatusOr<RankEma::Saved> ReadEma(const std::string& step_dir,
                                         const checkpoint::GroupedIndex& index,
                                         storage::Storage* storage,
                                         const std::function<bool()>* cancelled);
  absl::Status InstallEma(RankEma::Saved saved, int64_t step);
  // ---- restore from memory ----
  // Steps of the snapshots held from the previous trainer, newest first.
  std::vector<int64_t> MemorySteps() const ABSL_LOCKS_EXCLUDED(mu_);
  // The snapshot of `step` held from the previous trainer (its slot and
  // timeline), if it is held.
  std::optional<SlotSnapshot> Held(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // Gives this session the EMA that goes with the held snapshots (the
  // previous trainer's, or, where that one ended before it snapshotted or
  // restored, the one before it: SkipEmptyPredecessors), for a restore of
  // `step` from memory. OK and a no-op without an EMA; an EMA the
  // predecessor did not have, or kept of other tensors or with another
  // decay, starts afresh (logged).
  absl::Status TakePredecessorEma(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the EMA of `stopped` (a stopped session of this rank that this
  // one replaces in place, its EMA at `step`), as TakePredecessorEma does.
  // (Not a restore: every snapshot the trainer publishes is folded in.)
  void AdoptEmaOf(RankSession& stopped, int64_t step) { ema_.AdoptFrom(stopped.ema_, step, 0); }
  // Frees the held slots and drops the predecessor (the trainer restored, or
  // went on without restoring). Idempotent. The snapshot of `restored` (the
  // step the trainer restored from memory) stays accounted as intact in its
  // slot until the trainer claims it, for a successor should this trainer
  // die first; the others are forgotten: they belong to a timeline the
  // trainer has left (a step it replays must never be served from them).
  void ReleaseHeld(std::optional<int64_t> restored = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);
  // True when every registered tensor is staged: a restore from memory can
  // then serve all of them (a replica another rank writes is not in the slot).
  bool AllStaged() const;
  // The newest step the EMA has folded in; nullopt without an EMA.
  std::optional<int64_t> ema_step() const {
    return ema_.enabled() ? std::optional<int64_t>(ema_.last_step()) : std::nullopt;
  }
  // After Stop(): the FULL snapshots intact in the staging segment, newest
  // first (ingested, and their slot not taken again by the trainer; those
  // still held from a predecessor).
  std::vector<SlotSnapshot> IntactSnapshots() const ABSL_LOCKS_EXCLUDED(mu_);
  // After Stop(): hands the staging segment over to a successor session.
  shm::Segment TakeSegment();

  // The read begun at registration for the restore that usually follows
  // (daemon/restore/restore_prefetch.h): kept until a restore takes it, or discarded
  // (cancelled, its slot freed) when the trainer snapshots first or the
  // session stops.
  void SetPrefetch(std::unique_ptr<RestorePrefetch> prefetch) ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<RestorePrefetch> TakePrefetch() ABSL_LOCKS_EXCLUDED(mu_);

  const RankSessionOptions& options() const { return options_; }
  uint64_t segment_bytes() const { return slots_.segment_bytes(); }
  // The rank's EMA in zccd's memory (0 without one).
  uint64_t ema_bytes() const { return ema_.allocated_bytes(); }
  // What the rank holds in the staging budget: its segment, its EMA and the
  // restore buffers it holds or zccd is filling for it.
  uint64_t budget_bytes() const {
    return segment_bytes() + ema_bytes() + restore_buffers_.bytes();
  }
  RankCounters counters() const;

 private:
  // `inherited` with its predecessor replaced by the session whose EMA goes
  // with the snapshots it passes on (see the definition).
  static Inheritance SkipEmptyPredecessors(Inheritance inherited);
  void IngestLoop();
  // Takes in the slots published, oldest first; returns true if it processed
  // at least one. One caller at a time (ingest_mu_).
  bool IngestReadySlots() ABSL_LOCKS_EXCLUDED(ingest_mu_);
  // A snapshot of `step` went to the peer tier: nothing up to it is owed
  // any more.
  void PaidReplication(int64_t step);
  // On the ingest thread, after each round: a due step left out is paid as
  // soon as the replication writer is free (it rings the doorbell when it
  // goes idle with something owed), from the newest FULL snapshot, so that a
  // trainer that pauses or stops snapshotting still has its newest due step
  // in the peer tier. Nothing waits: a writer busy again is left to ring.
  void PayOwedReplication();
  // The newest FULL snapshot, claimed for the replication owed, if any is
  // owed and the snapshot is of the owed step or later, with the EMA still
  // as of its step (an EMA-only snapshot since moved the EMA on: the next
  // FULL one pays instead).
  std::optional<shm::ReadySlot> ClaimOwedReplication();
  // For the trainer gone: false once stopped; else ingests what it
  // published and not yet ingested.
  bool IngestWhatIsLeft() ABSL_LOCKS_EXCLUDED(mu_);
  // The newest complete FULL snapshot, if it is of `min_step` or later,
  // claimed for a write (its slot then freed by the write).
  std::optional<shm::ReadySlot> ClaimNewestFull(int64_t min_step);
  // Updates the EMA from the slot; returns true when the slot's step is due
  // and the slot went to the writer (which frees it), false when the caller
  // frees it.
  bool Process(const shm::ReadySlot& slot);
  void SetError(std::string error);
  // Submits `slot` to the writer with a copy of the EMA as of its step.
  // Waits for the writer to be idle, then hands it the slot to persist
  // (and to replicate).
  void SubmitWrite(const shm::ReadySlot& slot, bool on_failure, bool replicate = false);
  WriteJob MakeWriteJob(const shm::ReadySlot& slot, bool on_failure, bool persist, bool replicate);
  // What a writer of this session writes for (the constructor's).
  RankWriteTarget WriteTarget(PersistCallback on_persisted, std::function<void()> on_idle);

  const checkpoint::RankShards shards_;
  const std::vector<RegisteredTensor> registered_;
  const RankSessionOptions options_;
  StagingSlots slots_;
  const uint64_t registered_ns_;
  const bool pid_visible_;
  RankEma ema_;
  HeldSnapshots held_;

  std::atomic<bool> save_requested_{false};
  std::atomic<bool> retiring_{false};
  std::atomic<int64_t> retiring_since_ns_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> last_snapshot_step_{-1};
  // True while prefetch_ is set: lets the ingest loop skip TakePrefetch's lock.
  std::atomic<bool> has_prefetch_{false};
  std::atomic<uint64_t> snapshots_ingested_{0};
  // Replication steps left out because the writer was busy.
  std::atomic<uint64_t> replications_skipped_{0};
  // The newest due replication step left out and not yet made up for by a
  // later snapshot (-1: none). Set by ingest (also run by
  // PersistNewestOnFailure and ReplicateOwed beside the ingest thread); paid
  // by ingest or ReplicateOwed, whichever claims the snapshot's slot.
  std::atomic<int64_t> replication_owed_{-1};
  // The step the last restore served, until the trainer snapshots a later
  // one (-1: none).
  std::atomic<int64_t> restored_step_{-1};
  // The next step replicated is the first since the trainer went on from a
  // restore (checkpoint::RankStepBytes::went_on_from).
  std::atomic<int64_t> supersede_next_{-1};  // the restored step; -1: none
  // Restores served (RankWriteTarget::left_behind), the last one's step, and
  // the trainer's publication count then (a slot's seq below it was
  // published before).
  std::atomic<uint64_t> restores_{0};
  std::atomic<int64_t> last_restored_{-1};
  // The step of the last NoteRestored that read it from a directory (-1:
  // that restore was from memory).
  std::atomic<int64_t> restored_from_disk_{-1};
  std::atomic<uint64_t> restored_seq_{0};
  // The timelines of the snapshots published before the last restore and of
  // those of later steps published after it (the same when it named none).
  mutable zcc::Mutex timeline_mu_;
  std::string timeline_before_ ABSL_GUARDED_BY(timeline_mu_);
  std::string timeline_after_ ABSL_GUARDED_BY(timeline_mu_);
  // The timeline of the snapshot in `slot`.
  std::string TimelineOf(const shm::ReadySlot& slot) const ABSL_LOCKS_EXCLUDED(timeline_mu_);
  std::thread thread_;

  mutable zcc::Mutex mu_;
  // Held while slots are taken in (IngestReadySlots: the ingest thread, and
  // a retirement draining what is left before the session stops): the EMA
  // folds snapshots in the order they were published, and two takers would
  // interleave them. Held across the EMA's update; the only other taker
  // waits for it, as it would for the ingest thread to finish.
  zcc::Mutex ingest_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Slots taken whose snapshot was published after the rest of their round
  // (a due step took a ready slot over): processed first in the next.
  std::vector<shm::ReadySlot> deferred_ ABSL_GUARDED_BY(ingest_mu_);
  bool ingest_closed_ ABSL_GUARDED_BY(ingest_mu_) = false;  // Stop: no more ingest
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  RestoreBuffers restore_buffers_;
  std::unique_ptr<RestorePrefetch> prefetch_ ABSL_GUARDED_BY(mu_);
  // Set before Start(), stopped (not destroyed: its counts stay) by Stop().
  std::unique_ptr<RankPuller> puller_;
  // Both writers' hand-ins to the peer tier, in order (RankWriteTarget).
  zcc::Mutex replicate_order_;
  // Last: declared after everything a write touches, so it is destroyed (and
  // its thread joined) first.
  RankWriter writer_;
  // Steps replicated without being persisted: a writer of their own, so that
  // a checkpoint never waits for one (and one never waits for a checkpoint).
  // Each writer's job carries its own EMA copy: while both write, zccd holds
  // the rank's EMA twice besides the live one (RankWriter's one-at-a-time
  // holds per writer).
  RankWriter replicate_writer_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_RANK_SESSION_H_
