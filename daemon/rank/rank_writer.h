// The writer stage of one rank: a one-deep queue and the thread that writes a
// checkpoint step's shards from a staging slot, so ingest (and with it the
// EMA and the free slots the trainer needs) never waits for the disk. The
// writer owns the write: the shards with the job owner's identity, the
// failure counts the trainer reads from the control block, the slot freed
// after, and the outcome reported to the job's committer.
//
// The writes run on zccd's writer threads (common/task_pool.h), shared by
// every rank. One write runs per rank at a time. Submit waits until the writer is idle,
// then builds the job under the writer's lock, so two submitters (ingest and
// persist-on-failure) never both find it idle, and the EMA copy a job carries
// exists for one job at a time (zccd's steady-state memory is the EMA, not
// twice the EMA).
//
// Thread-safety: all methods may be called from any thread; the write
// function runs on the writer thread only.
#ifndef ZCC_DAEMON_RANK_RANK_WRITER_H_
#define ZCC_DAEMON_RANK_RANK_WRITER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "checkpoint/rank_step_bytes.h"
#include "checkpoint/io_options.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/shard_writer.h"
#include "common/fs_identity.h"
#include "common/mutex.h"
#include "daemon/rank/staging_slots.h"
#include "common/task_pool.h"
#include "shm/slot_ring.h"
#include "storage/aligned_buffer.h"

namespace zcc::daemon {

// One step to write. The slot is held (kIngesting) until the write function
// frees it; the EMA as of the step travels with the job and dies with it.
struct WriteJob {
  shm::ReadySlot slot;
  bool on_failure = false;  // persist-on-failure's write
  bool persist = true;      // write the step to the job's directory
  bool replicate = false;   // and/or serialize it for the peer tier (on_replicate)
  int64_t went_on_from = -1;  // see checkpoint::RankStepBytes
  uint64_t restores = 0;  // the rank's restores before its snapshot (RankWriteTarget)
  std::string timeline;   // its manifest's (format::RankManifest::timeline)
  storage::AlignedBuffer ema_copy;            // the EMA tensors back to back
  std::vector<checkpoint::ExtraShard> ema_shards;  // describing ema_copy
};

// Reported after every persist attempt, from the writer thread.
struct PersistEvent {
  uint32_t rank = 0;
  int64_t step = 0;
  absl::Status status;
  checkpoint::WriteStats stats;
  // Given up: the trainer went back to an older step while it was written
  // (RankWriteTarget::left_behind); no manifest of it stays.
  bool left_behind = false;
  // When the write began, on zccd's monotonic clock (a report that comes
  // late, after its step committed, is told from a write of the step again).
  std::chrono::steady_clock::time_point write_began{};
};
using PersistCallback = std::function<void(const PersistEvent&)>;

// What the writer writes for, and where its outcomes go.
struct RankWriteTarget {
  const checkpoint::RankShards* shards = nullptr;  // borrowed; outlives the writer
  StagingSlots* slots = nullptr;                   // borrowed; outlives the writer
  std::string job_dir;
  FsOwner fs_owner;        // whose file-system identity writes the shards
  checkpoint::IoOptions io;  // how (tests pass a slow or faulty storage)
  // After each attempt, with its slot already free.
  PersistCallback on_persisted;
  // A failed write, described for the rank's status.
  std::function<void(const std::string&)> on_error;
  // A step serialized for the peer tier (WriteJob::replicate), from the
  // writer thread with the slot still held; null: none is.
  std::function<void(checkpoint::RankStepBytes)> on_replicate;
  // Held across the left-behind check of a serialized step and its
  // on_replicate, by every writer of the rank (persisting and replicating
  // ones), so that a step of the state the trainer went back from never
  // reaches the peer tier after the first step after the restore (borrowed;
  // outlives the writer). Null: the writer's own.
  zcc::Mutex* replicate_order = nullptr;
  // Whether a write of `step`, from a snapshot taken after `restores`
  // restores of the rank (WriteJob::restores), was left behind by a restore
  // of an older step since: asked before its manifest and after the write
  // (its manifest then removed); it is then neither committed nor
  // replicated. Null: never.
  std::function<bool(int64_t step, uint64_t restores)> left_behind;
  // As the writer goes idle after a write, under the writer's lock (so that
  // Stop, which waits for that lock, returns only after it): quick, and not
  // calling into the writer. Null: nothing is told.
  std::function<void()> on_idle;
};

class RankWriter {
 public:
  // Writes on `pool` (borrowed, outlives the writer), or, where it is null,
  // on a thread of the writer's own (tests).
  RankWriter(RankWriteTarget target, TaskPool* pool = nullptr);
  ~RankWriter();  // Stop()
  RankWriter(const RankWriter&) = delete;
  RankWriter& operator=(const RankWriter&) = delete;

  // Waits until nothing is queued or running, then queues `make()`'s job.
  // `make` runs under the writer's lock: it must not call back into the
  // writer (it may take locks acquired after it, e.g. the EMA's).
  void Submit(absl::FunctionRef<WriteJob()> make);
  // As Submit, but only when the writer is idle now: false (nothing made)
  // while it writes, so that the caller never waits for a disk.
  bool TrySubmit(absl::FunctionRef<WriteJob()> make);
  // Returns once nothing is queued or running.
  void AwaitIdle();
  // Whether nothing is queued or running now (it may change at once).
  bool idle() const;
  // Finishes the queued job, if any. Idempotent.
  void Stop() { AwaitIdle(); }

  int64_t last_persisted_step() const;
  // A restore of `step`: a step persisted after it is no longer the
  // trainer's newest (lowers last_persisted_step to `step` where higher).
  void LowerLastPersisted(int64_t step);
  uint64_t persist_failures() const;

 private:
  // What the pool's task and the writer share: the task may still be
  // leaving the lock when the writer, idle, is destroyed.
  struct State;

  std::shared_ptr<State> state_;
  std::unique_ptr<TaskPool> own_pool_;  // where no pool was given
  TaskPool* const pool_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_RANK_WRITER_H_
