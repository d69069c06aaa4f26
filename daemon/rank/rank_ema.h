// The EMA one rank keeps in zccd's memory: folded in from the snapshots the
// ingest thread takes, copied for each checkpoint write and for the trainer's
// ReadEma, and set from a checkpoint on restore.
//
// Thread-safety: all methods may be called from any thread. The EMA's state
// is guarded by one lock, held across an update or a whole-EMA copy but never
// across disk I/O; status reads the published atomics and never waits for it.
// The lock is taken after the rank writer's (RankWriter::Submit's `make`).
#ifndef ZCC_DAEMON_RANK_RANK_EMA_H_
#define ZCC_DAEMON_RANK_RANK_EMA_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "daemon/rank/registered_tensor.h"
#include "daemon/rank/rank_writer.h"
#include "ema/ema_updater.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "shm/segment.h"

namespace zcc::daemon {

// Something an update could not do, for the rank's status.
struct EmaProblem {
  std::string message;
  bool log = true;  // false: status only (a repeated non-finite skip)
};

class RankEma {
 public:
  // `ema` may be null (the rank keeps no EMA); otherwise it averages the
  // tensors `sources` (staged parameters, same order), read from the slots at
  // their slot offsets every `interval`-th step. `metrics` may be null.
  RankEma(std::unique_ptr<ema::EmaUpdater> ema, std::vector<RegisteredTensor> sources,
          std::string job_id, uint32_t rank, uint32_t interval, metrics::ZccMetrics* metrics);
  RankEma(const RankEma&) = delete;
  RankEma& operator=(const RankEma&) = delete;

  bool enabled() const { return enabled_; }
  // The EMA's memory (its fp32 buffers, allocated whole at registration;
  // AdoptFrom swaps it for one of the same tensors), counted in the staging
  // budget.
  uint64_t allocated_bytes() const { return allocated_bytes_; }
  size_t num_tensors() const { return sources_.size(); }
  int64_t last_step() const { return last_step_.load(std::memory_order_relaxed); }
  uint64_t skipped_nonfinite() const { return skipped_nonfinite_.load(std::memory_order_relaxed); }
  // Snapshots taken in after a later-published one was folded in, and so
  // lost to the EMA (ingest keeps the order of publication: a fault of it).
  uint64_t out_of_order() const { return out_of_order_.load(std::memory_order_relaxed); }

  // Folds in the snapshot of `step` held in `slot` when the step is on the
  // interval and newer than the EMA's, and the snapshot (published as `seq`)
  // came after the last restore's EMA was set (Install, AdoptFrom): one
  // published before is of the state the restore replaced. No-op without
  // an EMA.
  std::optional<EmaProblem> Update(const uint8_t* slot, uint64_t slot_bytes, int64_t step,
                                   uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies the EMA into `job` (its ema_copy and one "ema" shard for `rank`,
  // with the step it was last updated at, for the manifest); leaves them
  // empty without an initialised EMA, or with one that has folded in steps
  // after job->slot.step (said in the log).
  void CopyForWrite(WriteJob* job) ABSL_LOCKS_EXCLUDED(mu_);

  // A new segment `shm_name` (owned by `owner`) holding the EMA, laid out as
  // a one-slot staging segment, and the response describing it.
  // FailedPrecondition without an EMA.
  absl::StatusOr<std::pair<shm::Segment, v1::ReadEmaResponse>> CopyToSegment(
      const std::string& shm_name, uid_t owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until the EMA has folded in `step` or a newer one, at most until
  // `deadline` or Interrupt(); returns whether it has. Woken by each update.
  bool AwaitStep(int64_t step, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every AwaitStep, now and later (the rank's session is stopping).
  void Interrupt() ABSL_LOCKS_EXCLUDED(mu_);

  // A checkpoint step's EMA, read by ReadSaved for Install.
  struct Saved {
    bool present = false;  // false: nothing to install (no EMA, or none saved)
    std::vector<std::vector<float>> data;  // per source tensor
    uint64_t bytes() const {
      uint64_t n = 0;
      for (const std::vector<float>& d : data) n += d.size() * sizeof(float);
      return n;
    }
  };
  // Reads the "ema" tensors of a checkpoint step (whose grouped index is
  // `index`), whatever layout wrote them, with `io`, without the lock, so
  // that it can run beside the read of the step's other tensors. Not present
  // without an EMA; a step without this rank's EMA tensors gives none either
  // (logged: the EMA starts afresh from the next snapshot). Changes nothing.
  absl::StatusOr<Saved> ReadSaved(const std::string& step_dir,
                                  const checkpoint::GroupedIndex& index,
                                  const checkpoint::IoOptions& io) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets the EMA to `saved` as of `step` (a no-op when it is not present);
  // snapshots published before `next_seq` are never folded into it.
  absl::Status Install(Saved saved, int64_t step, uint64_t next_seq) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes over `from`'s EMA (the rank's previous trainer's, kept in memory)
  // for a restore of `step` from memory: the two are swapped, in O(1). An
  // EMA `from` does not have (or keeps of other tensors, or with another
  // decay) leaves this one to start afresh, logged. When `from` folded in
  // steps newer than `step`, they stay in (logged); the trainer's replay of
  // those steps is then not folded in again (updates only move forward).
  // Snapshots published before `next_seq` are never folded into it.
  void AdoptFrom(RankEma& from, int64_t step, uint64_t next_seq)
      ABSL_LOCKS_EXCLUDED(mu_, from.mu_);

 private:
  void PublishCounters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `from`'s EMA cannot replace this one (empty: it can).
  std::string Incompatibility(const RankEma& from) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, from.mu_);

  const bool enabled_;
  const std::vector<RegisteredTensor> sources_;
  const std::vector<uint64_t> offsets_;  // slot offsets of sources_
  const std::string job_id_;
  const uint32_t rank_;
  const uint32_t interval_;
  metrics::ZccMetrics* const metrics_;
  const uint64_t allocated_bytes_;
  mutable zcc::Mutex mu_;
  // Swapped with a predecessor's by AdoptFrom, hence guarded itself.
  std::unique_ptr<ema::EmaUpdater> ema_ ABSL_GUARDED_BY(mu_) ABSL_PT_GUARDED_BY(mu_);
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  // Snapshots published (numbered) below it are not folded in (Update).
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // The publication number of the snapshot folded in last (0: none since
  // the EMA was set).
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> last_step_{-1};
  std::atomic<uint64_t> skipped_nonfinite_{0};
  std::atomic<uint64_t> out_of_order_{0};
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_RANK_EMA_H_
