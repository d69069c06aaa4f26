// The zcc trainer client: the only header a C++ trainer needs.
//
//   zcc::ClientOptions opts;
//   opts.job_id = "llama-8b"; opts.rank = rank; opts.world_size = world;
//   opts.save_every = 100;
//   auto client = zcc::Client::Connect(opts).value();
//   client->RegisterTensors(tensors);            // name, dtype, shape, pointer, kind
//   int64_t step = client->Restore().value_or(0);  // or start fresh
//   for (...) {
//     client->FenceBeforeUpdate(stream);         // before optimizer.step()
//     optimizer_step();
//     client->Snapshot(step, zcc::SnapshotKind::kFull, stream);  // microseconds
//   }
//
// Snapshot() only enqueues the device-to-host copies into a free staging slot
// and returns; a notifier thread waits for the copies and publishes the slot
// to zccd. It never copies bytes or makes an RPC on the caller's thread, and
// never blocks unless Backpressure::kBlock was chosen. When zccd is absent or
// dies, snapshots are skipped (and counted), and the client re-registers in the
// background with backoff; training never waits for the daemon.
//
// Thread-safety: Snapshot, FenceBeforeUpdate, Restore and RegisterTensors are
// meant for the one training thread; Stats() and DaemonStatus() may be called
// from any thread.
#ifndef ZCC_CLIENT_CLIENT_H_
#define ZCC_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "copy/device_copier.h"
#include "format/dtype.h"
#include "format/tensor_kind.h"

namespace zcc {

// How a daemon-pull copier is made (cuda/ipc_pull_copier.h): only those who
// make one need it, not the trainers that include this header.
struct IpcPullCopierOptions;

using format::DType;
// kParam, kOptim or kExtra: which shard file a tensor goes to; only kParam
// tensors can be EMA-eligible.
using format::TensorKind;

enum class SnapshotKind { kEmaOnly, kFull };
// What Snapshot does when no staging slot is free. With kSkip and
// save_every > 0, a step due for a checkpoint takes over a slot whose ordinary
// snapshot zccd has not ingested yet (that snapshot is then skipped), so a
// checkpoint step is only missed when the disk cannot keep up with the
// checkpoint interval itself. kBlock drops nothing: every snapshot, due or
// not, waits for a free slot.
enum class Backpressure {
  kSkip,   // no free slot: drop the snapshot and count it (default)
  kBlock,  // no free slot: wait for one
};

inline constexpr int64_t kLatestStep = -1;

// Which replicas hold identical copies of a tensor (DESIGN.md section 4). The
// checkpoint writes a replicated tensor once: every member computes the same
// byte-balanced assignment from the identical registration and only the chosen
// member stages and writes it, so PCIe traffic, staging memory and disk writes
// fall with the replica count. Tensors with group_size <= 1 belong to their rank.
struct ReplicaGroup {
  enum class Kind { kNone, kDataParallel, kExpertDataParallel };
  Kind kind = Kind::kNone;
  uint32_t group_size = 1;
  uint32_t rank_in_group = 0;
  // Global expert id for kExpertDataParallel (its checkpoint name should not
  // depend on which rank holds the expert); -1 otherwise.
  int64_t expert_id = -1;
};

struct TensorRef {
  // The global tensor's name: the same on every rank that holds a piece of it.
  std::string name;
  DType dtype = DType::kF32;
  // This rank's piece: the local tensor's shape.
  std::vector<int64_t> shape;
  // The tensor's memory (host, or device for a device copier). It must stay at
  // this address, with this size, for as long as the client lives.
  void* data = nullptr;
  TensorKind kind = TensorKind::kParam;
  bool ema_eligible = false;
  ReplicaGroup replica;
  // A piece of a larger global tensor (tensor parallel, FSDP/ZeRO shard, a
  // range of stacked experts): the global shape and where this piece starts
  // in it, per dimension. Both empty: the whole tensor. The pieces of all
  // ranks tile the global tensor (replicas of a piece aside); a checkpoint
  // restores into any other tiling, and `zccctl export` writes whole tensors.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
  // kExtra only: a step without this tensor restores anyway, the tensor
  // filled with zeros and named in RestoreResult::missing (the per-rank state
  // of a rank the job that wrote the step did not have). Any other tensor a
  // step lacks fails the restore.
  bool optional = false;
};

// Keys of an S3-compatible store (AWS's names).
struct StoreCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only
};

struct ClientOptions {
  std::string socket_path;      // empty: zccd's default for this user
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t num_slots = 0;       // staging slots; 0 = daemon default (3)
  uint32_t save_every = 0;      // persist every N-th step; 0 = only on SaveNow
  uint32_t keep_last = 0;       // committed steps kept; 0 = daemon default
  std::string checkpoint_root;  // empty: the daemon's default root
  // For an s3:// checkpoint_root: the job's own keys for the store, which
  // zccd uses for this job's directory alone and keeps in memory only.
  // Empty access_key_id: zccd's own credentials for that root.
  StoreCredentials store_credentials;
  // The tiered mode: checkpoints go to checkpoint_root (a local root) first,
  // and zccd uploads each committed step to this object-store root
  // (s3://bucket/prefix) in the background, keeping upload_keep_last steps
  // there (0: zccd's keep_last). Empty: no upload.
  std::string upload_root;
  uint32_t upload_keep_last = 0;
  // With upload_root, on node-local disks (no file system the nodes share):
  // each node's zccd uploads its own ranks' files and the step commits in
  // the store (RegisterRequest.node_local_root).
  bool node_local_root = false;
  // The job's run, the same on every rank and new for each run
  // (RegisterRequest.run_id): a step commits only from manifests of one run.
  std::string run_id;
  Backpressure backpressure = Backpressure::kSkip;
  // zccd keeps an fp32 EMA of the EMA-eligible parameters this rank writes:
  // ema = decay * ema + (1 - decay) * param, every ema_interval-th snapshot.
  // 0 = no EMA.
  float ema_decay = 0;
  uint32_t ema_interval = 1;
  // If this process dies, zccd persists its newest complete snapshot (when it
  // is newer than the last checkpoint), so a crash loses at most the steps
  // since the last snapshot rather than since the last checkpoint.
  bool persist_on_failure = false;
  // The trainer restores right after registering (a restart): zccd begins
  // reading the newest checkpoint into a staging slot as the first
  // registration arrives, so that Restore finds it read or under way while
  // the trainer pins memory and builds its model. Restoring another step, or
  // snapshotting first, drops that read; a trainer that does not restore
  // should leave this off, since the read costs disk bandwidth.
  bool prefetch_restore = false;
  // Copy backend. When null, one is chosen by `copy_backend`: kHost (the
  // default: memcpy on a copy thread, for host tensors), kCuda (the CUDA
  // copier on `cuda_device`, for GPU tensors; Connect fails if it cannot be
  // used), kCudaIpc (daemon-pull: zccd copies the GPU tensors itself over
  // CUDA IPC, the trainer only records an event per snapshot; registration
  // fails unless zccd's config enables daemon_pull) or kAuto (daemon-pull
  // when zccd offers it, else CUDA when a usable device exists, else host
  // with one log line: only for host tensors then, since a host copier cannot
  // read GPU memory). Daemon-pull needs tensors in cudaMalloc memory
  // (PyTorch's caching allocator without expandable segments).
  std::shared_ptr<DeviceCopier> copier;
  enum class CopyBackend { kHost, kCuda, kAuto, kCudaIpc };
  CopyBackend copy_backend = CopyBackend::kHost;
  int cuda_device = 0;
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of one Restore call (a large checkpoint read from disk takes
  // longer than an RPC); zccd stops reading when the client gives up.
  absl::Duration restore_timeout = absl::Minutes(30);
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
  // No daemon heartbeat for this long: the daemon is considered gone.
  absl::Duration daemon_timeout = absl::Seconds(3);
  absl::Duration reconnect_max_backoff = absl::Seconds(5);
  // kCudaIpc: makes each registration's daemon-pull copier. Null: the one
  // this client library links (NewIpcPullCopier; the host-only client has
  // none, and a caller that loads CUDA on its own, like the Python module,
  // passes it here).
  std::function<absl::StatusOr<std::shared_ptr<DeviceCopier>>(IpcPullCopierOptions)>
      daemon_pull_copier;
};

enum class SnapshotResult {
  kEnqueued,
  kSkippedNoSlot,        // every slot still busy (daemon slower than the step)
  kSkippedDisconnected,  // no live registration with zccd
  // The copy could not be enqueued: pinning the slot or the copier failed
  // (Stats().last_error says why). The registration stays; the next
  // snapshot tries again.
  kSkippedCopyFailed,
};

struct ClientStats {
  bool connected = false;
  uint64_t snapshots_enqueued = 0;
  uint64_t snapshots_published = 0;
  uint64_t skipped_no_slot = 0;
  uint64_t skipped_disconnected = 0;
  uint64_t skipped_copy_failed = 0;
  // Published ordinary snapshots whose slot a step due for a checkpoint took
  // over before zccd ingested them (also in zccd's skip count: their EMA
  // update did not happen).
  uint64_t replaced_by_checkpoint = 0;
  uint64_t registrations = 0;   // successful registrations (1 + reconnects)
  int64_t last_published_step = -1;
  // Checkpoint writes zccd reported failed for this rank (each is also logged
  // as an error with zccd's reason, which becomes last_error), and the step
  // of the newest one (-1: none).
  uint64_t checkpoint_failures = 0;
  int64_t last_failed_checkpoint_step = -1;
  std::string last_error;
};

// What Restore brings back.
struct RestoreOptions {
  // kLatestStep: the newest step this rank can restore: a snapshot zccd kept
  // in memory from this rank's previous trainer (it died or exited, and this
  // client registered the same tensors), or the newest committed step that
  // reads back intact, whichever is newer. Otherwise that step, from memory
  // when zccd holds it, else from disk. The ranks of a job must restore the
  // same step: agree on one with ListRestoreCandidates first (zcc.torch does).
  int64_t step = kLatestStep;
  // Only the tensors this rank writes (RegisterTensors' replica groups pick
  // one writer per replicated tensor); the others are left untouched for the
  // caller to receive from their writers (one read per job instead of one
  // per replica). RestoreResult::restored says which were filled.
  bool owned_only = false;
  // With an explicit step: when it is found damaged while it is read, fall
  // back to the next older committed step (always so for kLatestStep).
  bool allow_older = false;
  // The job's ranks restore together through this collective (collective.h;
  // every rank passes its own member, and every rank calls Restore with the
  // same `step`: ranks that ask for different ones all fail, naming what
  // each asked for): they agree on one step (the newest all of them can
  // restore, when `step` is kLatestStep; a rank that finds it damaged makes
  // all fall back, as often as another rank's is damaged too), each
  // restores from its zccd only the pieces it writes, and every other piece
  // arrives from the lowest rank that restored it, so a job reads each
  // replicated piece once. An error on any rank fails Restore on every rank.
  // owned_only is implied. The run goes on in a new timeline that rank 0
  // draws and every rank adopts once all have the step (RestoreDone): the
  // manifests of its later steps name it, and a step commits only from
  // manifests of one timeline, so a write of the steps it left that
  // outlived the restore never completes one it writes again (adopted only
  // once every rank says its pieces arrived). Null: this
  // rank restores alone (and goes on in the timeline of the step restored).
  Collective* collective = nullptr;
  // Per registered tensor (empty: none): tensors that nothing reads until
  // Restore returns, and which may be written before the whole step is
  // read (a trainer's fresh optimizer buffers, say). Each is copied out of
  // the staging slot as soon as zccd has read and checked its bytes, while
  // zccd reads the rest, instead of after the whole step: on a fast disk the
  // copy hides behind the read. Nothing unchecked is ever written to them,
  // but if the step then turns out damaged elsewhere they hold its checked
  // bytes until the fallback's overwrite them, and if the restore fails they
  // keep them. With a collective, each rank copies the pieces it reads
  // itself this way.
  std::vector<bool> early_copy;
};

struct RestoreResult {
  int64_t step = -1;
  bool from_memory = false;            // zccd's memory, not the disk
  // The newest step zccd's EMA of this rank has folded in after the restore
  // (-1 without an EMA). From memory it can be ahead of `step`: the previous
  // trainer's EMA went on, and the steps replayed are not folded in twice.
  int64_t ema_step = -1;
  std::vector<bool> restored;          // per registered tensor, in order
  std::vector<std::string> skipped_steps;  // newer steps passed over, with why
  // Per registered tensor: it arrived through RestoreOptions::collective from
  // another rank rather than from zccd (empty without a collective).
  std::vector<bool> received;
  // Optional tensors (TensorRef::optional) the step does not hold: filled
  // with zeros.
  std::vector<std::string> missing;
};

// The steps this rank can restore, each newest first.
struct RestoreCandidates {
  std::vector<int64_t> memory_steps;  // kept by zccd from the previous trainer
  std::vector<int64_t> disk_steps;    // committed
};

// The job's checkpoint state as zccd on this node reports it.
struct CheckpointStatus {
  int64_t last_committed_step = -1;
  uint64_t last_checkpoint_bytes = 0;  // written by this node for that step
  double last_checkpoint_seconds = 0;
  double last_checkpoint_gbps = 0;
  std::vector<std::string> pending_commits;
  std::string last_error;
};

class Client {
 public:
  // Validates the options and opens the channel. Does not need zccd to be up.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  // Close(keep_snapshots=true) unless Close was called: a trainer that goes
  // away without closing (an exception unwinding) is treated like one that
  // died, and its snapshots stay in zccd's memory for the next trainer.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The trainer is done: publishes snapshots still in flight, unregisters and
  // stops the client's threads. zccd releases the rank's staging memory at
  // once, unless `keep_snapshots` asks it to keep the newest snapshots for
  // retain_snapshots_s, for a restore from memory by a trainer started next
  // (a launcher that restarts the job). Idempotent; the client takes no
  // snapshot afterwards. The error is the unregistration's (zccd away: its
  // memory is reclaimed when it notices the trainer gone).
  absl::Status Close(bool keep_snapshots = false);

  // Registers the tensors with zccd (once per client). Invalid tensors, or a
  // registration zccd refuses, are errors. When zccd cannot be reached the
  // call still succeeds: the client keeps trying in the background, and
  // Stats().connected says when it is registered. While zccd is still
  // writing and committing the last checkpoint of the rank's previous
  // trainer (it died with a step due), the call waits for that, logging
  // every 30 s, so that the registration adopts that trainer's snapshots
  // and a Restore right after gets the newest from memory.
  absl::Status RegisterTensors(std::vector<TensorRef> tensors);

  // Registers `tensors` in place of the registered ones, keeping the rank's
  // EMA in zccd: for a state blob that outgrew its EXTRA tensor. Only EXTRA
  // tensors may differ, and only in size (InvalidArgument otherwise). Waits
  // until the snapshots enqueued so far are handed to zccd, which drains the
  // old registration's writes before it answers; the snapshots it held are
  // dropped (the next Snapshot is the new registration's first). On the
  // training thread, between steps. Refused by zccd (the staging budget,
  // say), the old registration stays and the error is returned; zccd out of
  // reach, the client registers `tensors` when it is back, as after
  // RegisterTensors.
  absl::Status ReplaceTensors(std::vector<TensorRef> tensors);

  // Enqueues a snapshot of `step` after the work already issued on `stream`
  // (device backends; nullptr = default stream) and returns.
  SnapshotResult Snapshot(int64_t step, SnapshotKind kind = SnapshotKind::kFull,
                          void* stream = nullptr);

  // Makes the next update of the tensors (on `stream`) wait until the copies
  // of every enqueued snapshot have read them.
  absl::Status FenceBeforeUpdate(void* stream = nullptr);

  // Fills the registered tensors from a committed checkpoint (kLatestStep =
  // the newest that verifies) and returns its step. NotFound when there is
  // nothing to restore; Unavailable when zccd is not reachable.
  absl::StatusOr<int64_t> Restore(int64_t step = kLatestStep, void* stream = nullptr);
  // The same, with the choices of RestoreOptions. Nothing is copied into
  // the tensors unless the whole step was read and checked.
  absl::StatusOr<RestoreResult> Restore(const RestoreOptions& options, void* stream = nullptr);
  // The steps Restore can serve this rank (`owned_only` as in RestoreOptions).
  absl::StatusOr<RestoreCandidates> ListRestoreCandidates(bool owned_only = false);

  // Where ReadEma puts one tensor's EMA: `elements` fp32 values.
  struct EmaOutput {
    std::string name;
    float* data = nullptr;
    uint64_t elements = 0;
  };

  // Copies zccd's current fp32 EMA of the named parameters (for evaluation)
  // and returns the last step folded into it (-1 before the first update,
  // when nothing is copied). zccd keeps the EMA of the parameters this rank
  // writes; NotFound names a tensor whose EMA another replica keeps, and
  // FailedPrecondition means the client was registered without ema_decay.
  // With `min_step` >= 0, zccd answers once its EMA has folded in that step
  // or a newer one (it folds snapshots in as it ingests them), or after
  // `wait`, with the EMA as it is then: compare the step returned.
  absl::StatusOr<int64_t> ReadEma(const std::vector<EmaOutput>& outputs, int64_t min_step = -1,
                                  absl::Duration wait = absl::ZeroDuration());

  // Asks zccd to persist the next full snapshot it takes in from each rank of
  // the job on this node (one already enqueued and not yet taken in counts:
  // usually the newest).
  absl::Status SaveNow();

  // Stores a file with the job (the model's config.json, tokenizer files):
  // zccd keeps it in the job's checkpoint directory (metadata/<name>,
  // replaced atomically) and `zccctl export` writes it next to the weights,
  // so that `from_pretrained` loads the export. `name`: [A-Za-z0-9._-], at
  // most 128 bytes, not starting with '.'; at most 16 MiB. An RPC: call it
  // once after registering, not per step.
  absl::Status PutJobFile(const std::string& name, const std::string& content);

  // The peer tier (DESIGN.md 5c): where other zccds reach the zccd this
  // rank registered with (host:port; empty when its peer service is off, or
  // before the registration).
  std::string PeerAddress() const;
  // Tells zccd the peer address of every rank's zccd, indexed by rank (what
  // the ranks' PeerAddress() gave, exchanged over the trainers' own
  // collective); empty entries are left out. Returns the addresses of the
  // zccds that hold this node's replicas of the job's pieces. An RPC: once
  // after registering.
  absl::StatusOr<std::vector<std::string>> SetJobPeers(const std::vector<std::string>& by_rank);
  // Both steps for a C++ trainer: all-gathers PeerAddress() over
  // `collective` (every rank calls it) and reports the list. Nothing is sent
  // when no rank's zccd has a peer service.
  absl::StatusOr<std::vector<std::string>> ShareJobPeers(Collective& collective);

  // Blocks until every snapshot enqueued so far has been handed to zccd (or
  // dropped because the daemon went away), at most `timeout`.
  absl::Status Flush(absl::Duration timeout = absl::Seconds(60));

  ClientStats Stats() const;

  // Blocks until the client is registered with zccd (Stats().connected), at
  // most `timeout`; returns whether it is. Woken by the registration itself
  // (the first, or the background re-registration after zccd came back),
  // not by polling.
  bool WaitConnected(absl::Duration timeout);

  // Asks zccd (an RPC; not for the training thread's hot path).
  absl::StatusOr<CheckpointStatus> QueryCheckpointStatus() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  absl::StatusOr<RestoreResult> RestoreTogether(const RestoreOptions& options, void* stream);

  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc

#endif  // ZCC_CLIENT_CLIENT_H_
