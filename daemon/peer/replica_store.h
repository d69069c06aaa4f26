// Pieces of other nodes' snapshots held in this zccd's memory (the peer
// tier, DESIGN.md 5c), within a byte budget: when a new piece needs the
// room, the pieces of the oldest steps go first. Each piece is stored only
// after its bytes matched the checksum it was pushed with, and served only
// for the job and uid it was pushed for.
//
// Thread-safety: every method may be called from any thread. A piece handed
// out by Get stays valid while the caller holds it, even if it is dropped
// from the store meanwhile.
#ifndef ZCC_DAEMON_PEER_REPLICA_STORE_H_
#define ZCC_DAEMON_PEER_REPLICA_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace zcc::daemon::peer {

struct ReplicaKey {
  std::string job_id;
  uint32_t uid = 0;
  uint32_t rank = 0;
  int64_t step = 0;
  std::string piece;

  auto Tie() const { return std::tie(job_id, uid, rank, step, piece); }
  bool operator<(const ReplicaKey& o) const { return Tie() < o.Tie(); }
  bool operator==(const ReplicaKey& o) const { return Tie() == o.Tie(); }
};

// What is known of a held piece.
struct ReplicaInfo {
  ReplicaKey key;
  uint64_t nbytes = 0;
  uint64_t xxh3 = 0;  // of the bytes, checked when they arrived
  std::string from_node;
  absl::Time received;
  // This zccd's own replicated step (the owner's copy, kept so that the step
  // exists in two failure domains), not a piece held for another node.
  bool own = false;
};

struct Replica {
  ReplicaInfo info;
  std::string bytes;
  // A rank's manifest pushed by another zccd: the step's other pieces it
  // pushed here before it (PushReplica's with_pieces). Put keeps the
  // manifest, which makes the step whole here, only where each is held.
  std::vector<std::string> with_pieces;
};

class ReplicaStore {
 public:
  // What the store holds, for status and gauges.
  struct Held {
    uint64_t bytes = 0;  // all of it, the pieces being received included
    size_t pieces = 0;
    uint64_t own_bytes = 0;  // of which this zccd's own replicated steps
    size_t own_pieces = 0;
    uint64_t incoming_bytes = 0;  // of which pieces being received (Reserve)
  };

  // The room a piece being received takes until it is kept (Reserve): its
  // bytes arrive into memory of the receiver's before they can be checked,
  // whole or in parts. Counted in the store's bytes, within its budget and
  // cap, from Reserve until the piece is Put with it or this is destroyed.
  // The store outlives it (zccd's peer service, which holds these, stops
  // before the registry that owns the store goes).
  class Incoming {
   public:
    Incoming(const Incoming&) = delete;
    Incoming& operator=(const Incoming&) = delete;
    ~Incoming();

    uint64_t bytes() const { return bytes_; }
    // A trainer's registration needed the room (ShrinkTo): no longer
    // counted, the piece's receiving ends and whoever holds its bytes frees
    // them (at its next chunk, or its assembly's next part or peer's Hello).
    bool revoked() const { return revoked_.load(std::memory_order_acquire); }

   private:
    friend class ReplicaStore;
    Incoming(ReplicaStore* store, const ReplicaKey& key, uint64_t bytes)
        : store_(store), key_(key), bytes_(bytes) {}

    ReplicaStore* const store_;
    const ReplicaKey key_;
    const uint64_t bytes_;
    std::atomic<bool> revoked_{false};
  };
  // `on_change` (optional) is told what is held after each change (a
  // gauge), outside the store's lock; `on_pushed_whole` (optional), also
  // outside it, of each manifest another zccd pushed here (a rank's step
  // whole here now). `room` (optional): the most bytes the store may hold
  // now beside what else shares its memory budget (zccd's staging budget:
  // trainers' staging comes first), asked outside the store's lock at each
  // Put; the store holds at most the smaller of it and `budget_bytes`.
  // `room_moves` (optional): a count that moves whenever something else
  // may take of that room (admissions): a Put that finds it moved between
  // asking room() and taking the lock asks again.
  explicit ReplicaStore(uint64_t budget_bytes, std::function<void(const Held&)> on_change = nullptr,
                        std::function<void(const ReplicaKey& manifest)> on_pushed_whole = nullptr,
                        std::function<uint64_t()> room = nullptr,
                        const std::atomic<uint64_t>* room_moves = nullptr)
      : budget_bytes_(budget_bytes),
        on_change_(std::move(on_change)),
        on_pushed_whole_(std::move(on_pushed_whole)),
        room_(std::move(room)),
        room_moves_(room_moves) {}

  // Keeps `replica` (its bytes already checked; info.nbytes is set from
  // them), replacing a piece of the same key, dropping the pieces of the
  // oldest steps (of any job) while it would not fit. Only pieces of a step
  // older than the new piece's give way, and only where their rank has a
  // newer step here whole (its manifest, which replication sends last): the
  // newest complete step of each rank stays until a newer one is complete.
  // Nor do the pieces of a job's pinned step (Pin). With `went_on_from`
  // >= 0 (the piece is of the rank's first step replicated after it went on
  // from a restore of that step), the steps its rank has whole here that
  // are newer than the piece's are of a run it left, having gone back to an
  // older step, and so is what came of the piece's own step before the
  // rank's run went on (the first such piece's arrival; its owner sends
  // the run left before it): they go at once, pinned or not, so that no
  // restore ever takes them (a late piece of an older step, without the
  // flag, drops nothing); and the rank's going on is noted for
  // DropLeftBehind (anew where steps went: a second going back to the same
  // step).
  // ResourceExhausted, keeping everything held, when the piece alone is
  // larger than the budget or nothing may give way. FailedPrecondition,
  // keeping nothing of it, for a manifest one of whose `with_pieces` is not
  // held (dropped while the manifest was on its way: for room, or as the
  // run its rank left; an empty step must not pass for whole, nor push
  // out the rank's older whole step).
  // With `room`, the piece takes the room reserved for it (unless revoked).
  absl::Status Put(Replica replica, int64_t went_on_from = -1, Incoming* room = nullptr);

  // Takes room for a piece of `nbytes` about to be received under `key`
  // (`went_on_from` as its Put will be told: the steps of the run its rank
  // left go now), dropping what a Put of it would drop to make it, but for
  // what only a kept manifest may drop (the rank's older steps its step
  // completes: a push that fails must not leave the rank without a whole
  // step here). A rank's manifest, a few KB, takes no room before it is
  // kept (a room of 0 bytes). A piece held under `key` already counts as
  // room, for one room of the key at a time (the total may pass the cap by
  // it until the new piece replaces it). ResourceExhausted, dropping
  // nothing for room, where the piece does not fit.
  absl::StatusOr<std::shared_ptr<Incoming>> Reserve(const ReplicaKey& key, uint64_t nbytes,
                                                    int64_t went_on_from = -1);

  // The job (`job_id`, `uid`) went on from a restore of step `restored`,
  // as this zccd's own ranks of it showed at `at` (their first snapshot
  // after it; Job::GoBack): the steps held here after `restored` of which a
  // piece arrived before its rank's run went on are of the run left behind,
  // and go whole, pinned or not (a pin above `restored` is lifted). A
  // rank's run went on when its first step after the restore arrived
  // (Put's `went_on_from` equal to `restored`, since this zccd's last going
  // back of the job to another step); where that has not arrived, at `at`
  // (its run's pieces come after that first step, which is sent before any
  // other). So a node lost before its first step after the restore reached
  // this holder does not leave the run it left restorable. Where this zccd
  // cannot tell (a first step of the same restore that arrives after this
  // zccd went on from it is late, or of a later going back to the same
  // step), it counts for nothing: pieces of the new run dropped here are
  // pushed again by their owner (its buddy checks, its next step). Of a
  // step, only the pieces that came before go (and its manifest): the new
  // run's pieces of a step of the same number stay. Returns the steps
  // that lost pieces, by rank. `told` (not null): another zccd of the job
  // told it (WentBack; this zccd runs none of its ranks): those ranks, its
  // own, went on at `at`, and the job's other ranks no later, or where
  // their first step after the restore arrived here, if earlier (a rank
  // lost before its own zccd could tell). What this zccd notes of goings
  // on is left as it is, and a pin is lifted only where its step lost
  // pieces: a tell late, or told again, drops only what came before.
  std::map<uint32_t, std::set<int64_t>> DropLeftBehind(const std::string& job_id, uint32_t uid,
                                                       int64_t restored, absl::Time at,
                                                       const std::set<uint32_t>* told = nullptr);

  // The piece, or NotFound (also for a uid other than the one it was pushed
  // for: whether another uid's job exists is not told).
  absl::StatusOr<std::shared_ptr<const Replica>> Get(const ReplicaKey& key) const;

  // The pieces held for `job_id` and `uid`, in key order.
  std::vector<ReplicaInfo> List(const std::string& job_id, uint32_t uid) const;

  // Drops pieces until at most `target` bytes are held, for a trainer's
  // registration that needs the memory (pins and the newest whole steps
  // hold only to the end), in turn, the oldest first each time: pieces of
  // steps superseded here (their rank has a newer step whole) and not
  // pinned; pieces of steps not whole here (part-received); other jobs'
  // pieces; the room of pieces being received (Incoming, revoked: other
  // jobs' first; their bytes are freed once their receivers see it, at
  // the next chunk or part, or a peer's Hello); then those of `job_id` and
  // `uid` (the registering job, whose restore may read them). A piece's rank manifest goes with it
  // (its step is no longer whole here). Returns the bytes dropped; with
  // `freed`, the dropped pieces go there, for the caller to free outside
  // its locks.
  uint64_t ShrinkTo(uint64_t target, const std::string& job_id = "", uint32_t uid = 0,
                    std::vector<std::shared_ptr<const void>>* freed = nullptr);

  // The most bytes the store may hold now: its budget, or less where the
  // room beside the trainers' staging is less.
  uint64_t cap() const ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps the pieces of `step` of `job_id` (for `uid`) here when newer ones
  // need room: the job's newest step whole in the tier, cluster-wide
  // (memory_tier.h), which a step whole for some ranks only must not push
  // out. Replaces the job's earlier pin; `step` < 0 lifts it.
  void Pin(const std::string& job_id, uint32_t uid, int64_t step);
  // Pin, unless `step` is the pinned step already or (with `may_move_back`
  // false) older than it, or (with `as_of`) the job went back here since
  // went_back_count() was `as_of`: `step` was found from holdings listed
  // before, which may be of the run it left. In one step with the checks.
  // True when it pinned.
  bool PinIfNewer(const std::string& job_id, uint32_t uid, int64_t step, bool may_move_back,
                  std::optional<uint64_t> as_of = std::nullopt);
  // Moves each time the job is seen going back here: DropLeftBehind, and a
  // rank's first step after a restore arriving (Put's `went_on_from`: its
  // first piece, or one that lifts the pin; not the later ones).
  uint64_t went_back_count(const std::string& job_id, uint32_t uid) const;
  // The job's pinned step, if any.
  std::optional<int64_t> pinned(const std::string& job_id, uint32_t uid) const;

  uint64_t budget_bytes() const { return budget_bytes_; }
  // The pieces' bytes and the room of those being received.
  uint64_t bytes_held() const;
  Held held() const;
  uint64_t pieces_dropped() const;

 private:
  // Eviction order: oldest step first, then the earliest received.
  using Age = std::tuple<int64_t, absl::Time, ReplicaKey>;
  static Age AgeOf(const Replica& r) { return {r.info.key.step, r.info.received, r.info.key}; }
  // Drops the piece; with `freed`, hands its bytes there instead of freeing
  // them under the lock.
  void DropLocked(const ReplicaKey& key, std::vector<std::shared_ptr<const void>>* freed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WholeLocked(const ReplicaKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A newer step of the piece's rank is held here whole.
  bool SupersededLocked(const ReplicaKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PinnedLocked(const ReplicaKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls `f(cap)` under mu_ once, cap() asked outside the lock (it reads
  // the trainers' staging, whose admission shrinks this store under its
  // own lock). An admission begun meanwhile may have taken the room: asked
  // again then (up to 4 times). One begun after the lock is taken counts
  // what `f` keeps, and shrinks the store if needed.
  template <typename F>
  void WithCapLocked(F&& f) ABSL_LOCKS_EXCLUDED(mu_) {
    for (int attempt = 1;; ++attempt) {
      const uint64_t moves = room_moves_ != nullptr ? room_moves_->load() : 0;
      const uint64_t most = cap();
      zcc::MutexLock lock(&mu_);
      if (room_moves_ != nullptr && room_moves_->load() != moves && attempt < 5) continue;
      f(most);
      return;
    }
  }
  // `room` no longer counted; false where it was not (Put, revoked).
  bool UncountLocked(Incoming* room) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops what gives way to a piece of `n` bytes under `key` (see Put),
  // counting `replaced` bytes as room, so that everything held and
  // incoming fits within `cap`; or ResourceExhausted, dropping nothing.
  // `verified`: the piece is checked and about to be kept (a manifest
  // then completes its step: the rank's older steps give way to it).
  absl::Status MakeRoomLocked(const ReplicaKey& key, uint64_t n, uint64_t replaced, uint64_t cap,
                              bool verified, std::vector<std::shared_ptr<const void>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void LogLeftBehind(const ReplicaKey& key, int64_t went_on_from,
                            const std::vector<int64_t>& steps);
  // For a manifest naming `with_pieces`: FailedPrecondition where one of
  // them is not held (see Put); InvalidArgument where a piece that is not
  // a manifest names any.
  absl::Status MissingPieceLocked(const Replica& manifest) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `cap`: the most bytes the store may hold (its budget, or less: room_).
  // Pieces dropped for room go to `freed`.
  absl::Status PutLocked(std::shared_ptr<const Replica> piece, uint64_t cap,
                         std::vector<std::shared_ptr<const void>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A piece of `key`'s rank's first step after it went on from a restore
  // of step `from` (Put's and Reserve's went_on_from), arriving at
  // `arrived`: drops the steps the rank has whole here that are newer than
  // `key`'s and, of `key`'s step, what came before the rank's run went on
  // (the run left's step of that number: its manifest would keep it whole
  // beside the new run's pieces), notes the going on, and lifts the job's
  // pin of a step dropped. Returns the steps that lost their manifest;
  // their pieces go to `freed`.
  std::vector<int64_t> WentOnLocked(const ReplicaKey& key, int64_t from, absl::Time arrived,
                                    std::vector<std::shared_ptr<const void>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the steps `key`'s rank has whole here that are newer than `key`'s
  // (see Put), returning them; their pieces go to `freed`.
  std::vector<int64_t> DropLeftBehindLocked(const ReplicaKey& key,
                                            std::vector<std::shared_ptr<const void>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes in went_on_ that `key`'s rank went on from step `from`, `key`'s
  // step the first after it, whose first piece arrived at `arrived`.
  // `again`: steps of a run it left were just dropped, so this is a new
  // going back even where one from the same step was noted before (its
  // record starts again).
  void NoteWentOnLocked(const ReplicaKey& key, int64_t from, absl::Time arrived, bool again)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Held HeldLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Held{bytes_held_ + incoming_bytes_, held_.size(), own_bytes_held_, own_pieces_held_,
                incoming_bytes_};
  }
  void Changed(const Held& held) const ABSL_LOCKS_EXCLUDED(mu_) {
    if (on_change_) on_change_(held);
  }

  const uint64_t budget_bytes_;
  const std::function<void(const Held&)> on_change_;
  const std::function<void(const ReplicaKey&)> on_pushed_whole_;
  const std::function<uint64_t()> room_;
  const std::atomic<uint64_t>* const room_moves_;
  mutable zcc::Mutex mu_;
  std::map<ReplicaKey, std::shared_ptr<const Replica>> held_ ABSL_GUARDED_BY(mu_);
  std::map<Age, ReplicaKey> by_age_ ABSL_GUARDED_BY(mu_);
  // The steps each rank (job, uid, rank) has whole here: its manifest held.
  std::map<std::tuple<std::string, uint32_t, uint32_t>, std::set<int64_t>> whole_
      ABSL_GUARDED_BY(mu_);
  uint64_t bytes_held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t own_bytes_held_ ABSL_GUARDED_BY(mu_) = 0;
  size_t own_pieces_held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pieces_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // The room of pieces being received, still counted (not Put, revoked or
  // destroyed), and its bytes.
  std::set<Incoming*> incoming_ ABSL_GUARDED_BY(mu_);
  uint64_t incoming_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The pinned step of each job (job_id, uid).
  std::map<std::pair<std::string, uint32_t>, int64_t> pinned_ ABSL_GUARDED_BY(mu_);
  // Each rank's (job, uid, rank) going on from a restore seen here (Put's
  // went_on_from): the step restored, and when the first piece of a first
  // step after it arrived. Cleared by the job's next DropLeftBehind.
  struct WentOn {
    int64_t from = -1;
    absl::Time arrived;
  };
  std::map<std::tuple<std::string, uint32_t, uint32_t>, WentOn> went_on_ ABSL_GUARDED_BY(mu_);
  // The step each job (job_id, uid) last went on from here (DropLeftBehind).
  std::map<std::pair<std::string, uint32_t>, int64_t> went_on_from_here_ ABSL_GUARDED_BY(mu_);
  // went_back_count() of each job that went back (one small entry a job,
  // kept while zccd runs, like went_on_from_here_).
  std::map<std::pair<std::string, uint32_t>, uint64_t> went_back_count_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_REPLICA_STORE_H_
