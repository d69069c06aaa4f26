#include "daemon/peer/replica_store.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"

namespace zcc::daemon::peer {
namespace {

// A rank's manifest, the last piece of its step replication sends: the
// step is whole here once it is.

bool IsManifest(const ReplicaKey& key) { return key.piece == format::ManifestFileName(key.rank); }

}  // namespace

bool ReplicaStore::SupersededLocked(const ReplicaKey& key) const {
  auto it = whole_.find(std::make_tuple(key.job_id, key.uid, key.rank));
  return it != whole_.end() && !it->second.empty() && *it->second.rbegin() > key.step;
}

bool ReplicaStore::WholeLocked(const ReplicaKey& key) const {
  auto it = whole_.find(std::make_tuple(key.job_id, key.uid, key.rank));
  return it != whole_.end() && it->second.count(key.step) > 0;
}

void ReplicaStore::DropLocked(const ReplicaKey& key,
                              std::vector<std::shared_ptr<const void>>* freed) {
  auto it = held_.find(key);
  if (it == held_.end()) return;
  if (freed != nullptr) freed->push_back(it->second);
  if (IsManifest(key)) {
    auto w = whole_.find(std::make_tuple(key.job_id, key.uid, key.rank));
    if (w != whole_.end()) {
      w->second.erase(key.step);
      if (w->second.empty()) whole_.erase(w);
    }
  }
  by_age_.erase(AgeOf(*it->second));
  bytes_held_ -= it->second->bytes.size();
  if (it->second->info.own) {
    own_bytes_held_ -= it->second->bytes.size();
    --own_pieces_held_;
  }
  held_.erase(it);
}

ReplicaStore::Incoming::~Incoming() {
  Held held;
  {
    zcc::MutexLock lock(&store_->mu_);
    if (!store_->UncountLocked(this)) return;
    held = store_->HeldLocked();
  }
  store_->Changed(held);
}

bool ReplicaStore::UncountLocked(Incoming* room) {
  if (incoming_.erase(room) == 0) return false;
  incoming_bytes_ -= room->bytes_;
  return true;
}

absl::StatusOr<std::shared_ptr<ReplicaStore::Incoming>> ReplicaStore::Reserve(
    const ReplicaKey& key, uint64_t nbytes, int64_t went_on_from) {
  if (nbytes > budget_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a piece of ", nbytes, " bytes is larger than this zccd's replica budget (",
                     budget_bytes_, " bytes)"));
  }
  // A manifest takes no room before it is kept (see the header).
  const bool counted = !IsManifest(key);
  std::shared_ptr<Incoming> room(new Incoming(this, key, counted ? nbytes : 0));
  std::vector<std::shared_ptr<const void>> freed;  // freed after the lock
  Held held;
  std::vector<int64_t> left_behind;
  absl::Status made;
  WithCapLocked([&](uint64_t most) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The run the rank left goes now, as at its Put: the room is made
    // beside what stays.
    if (went_on_from >= 0) left_behind = WentOnLocked(key, went_on_from, absl::Now(), &freed);
    held = HeldLocked();
    if (!counted) return;
    // A piece held under the key is room (its Put replaces it), once: not
    // for a second piece of the key under way.
    uint64_t replaced = 0;
    if (auto it = held_.find(key); it != held_.end()) replaced = it->second->bytes.size();
    for (const Incoming* other : incoming_) {
      if (other->key_ == key) replaced = 0;
    }
    made = MakeRoomLocked(key, nbytes, replaced, most, /*verified=*/false, &freed);
    if (made.ok()) {
      incoming_.insert(room.get());
      incoming_bytes_ += nbytes;
    }
    held = HeldLocked();
  });
  if (!left_behind.empty()) LogLeftBehind(key, went_on_from, left_behind);
  if (!freed.empty() || !left_behind.empty() || (made.ok() && counted)) Changed(held);
  ZCC_RETURN_IF_ERROR(made);
  return room;
}

void ReplicaStore::LogLeftBehind(const ReplicaKey& key, int64_t went_on_from,
                                 const std::vector<int64_t>& steps) {
  ZCC_LOG(WARNING) << "job " << key.job_id << " rank " << key.rank << " went on from step "
                   << went_on_from << " (step " << key.step << " the first after it): its "
                   << "step(s) " << absl::StrJoin(steps, ", ")
                   << " held here, of the run it left, are dropped";
}

absl::Status ReplicaStore::Put(Replica replica, int64_t went_on_from, Incoming* room) {
  const uint64_t n = replica.bytes.size();
  if (n > budget_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a piece of ", n, " bytes is larger than this zccd's replica budget (",
                     budget_bytes_, " bytes)"));
  }
  replica.info.nbytes = n;
  const ReplicaKey key = replica.info.key;
  const absl::Time arrived = replica.info.received;
  const bool pushed_whole = IsManifest(key) && !replica.info.own;
  auto piece = std::make_shared<const Replica>(std::move(replica));
  std::vector<std::shared_ptr<const void>> freed;  // freed after the lock
  Held held;
  std::vector<int64_t> left_behind;
  absl::Status put;
  bool uncounted = false;  // its room no longer counted: held moved
  WithCapLocked([&](uint64_t most) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (went_on_from >= 0) left_behind = WentOnLocked(key, went_on_from, arrived, &freed);
    // The piece takes its own room (one revoked is room no more).
    if (room != nullptr) uncounted = UncountLocked(room);
    put = MissingPieceLocked(*piece);
    if (put.ok()) put = PutLocked(std::move(piece), most, &freed);
    held = HeldLocked();
  });
  if (!left_behind.empty()) LogLeftBehind(key, went_on_from, left_behind);
  if (!put.ok() && left_behind.empty() && !uncounted) return put;
  Changed(held);
  ZCC_RETURN_IF_ERROR(put);
  if (pushed_whole && on_pushed_whole_) on_pushed_whole_(key);
  return absl::OkStatus();
}

absl::Status ReplicaStore::MissingPieceLocked(const Replica& manifest) const {
  const ReplicaKey& key = manifest.info.key;
  if (manifest.with_pieces.empty()) return absl::OkStatus();
  if (!IsManifest(key)) {
    return absl::InvalidArgumentError(absl::StrCat("piece '", key.piece, "' is not rank ",
                                                   key.rank, "'s manifest: it names no pieces"));
  }
  for (const std::string& name : manifest.with_pieces) {
    if (held_.count(ReplicaKey{key.job_id, key.uid, key.rank, key.step, name}) > 0) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "the manifest of step ", key.step, " of rank ", key.rank, " came without piece '", name,
        "' of the step held here (dropped while the manifest was on its way: for room, or as "
        "the run the rank left); the step is not taken for whole"));
  }
  return absl::OkStatus();
}

uint64_t ReplicaStore::cap() const {
  return room_ ? std::min(budget_bytes_, room_()) : budget_bytes_;
}

absl::Status ReplicaStore::MakeRoomLocked(const ReplicaKey& key, uint64_t n, uint64_t replaced,
                                          uint64_t cap, bool verified,
                                          std::vector<std::shared_ptr<const void>>* freed) {
  // Plan the eviction before dropping anything: only pieces older than this
  // one may make room for it, and only those of a rank whose newer step is
  // held here whole (its manifest is): the newest complete step of each
  // rank stays until a newer one is complete. (Over the cap already, when
  // trainers' staging took room since, more gives way than the piece needs.)
  uint64_t kept = bytes_held_ + incoming_bytes_ - replaced;
  auto fits = [&] { return kept <= cap && n <= cap - kept; };
  std::set<ReplicaKey> victims;
  auto evict = [&](const ReplicaKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (victims.insert(k).second) kept -= held_.at(k)->bytes.size();
  };
  for (auto it = by_age_.begin(); !fits() && it != by_age_.end(); ++it) {
    const ReplicaKey& k = it->second;
    if (k == key) continue;
    if (k.step >= key.step) break;
    // A rank's manifest completes its step: the rank's older steps are
    // superseded by it (else a step whose data fit could never complete).
    const bool completes = verified && IsManifest(key) && k.job_id == key.job_id &&
                           k.uid == key.uid &&
                           k.rank == key.rank;
    if (!(completes || SupersededLocked(k)) || PinnedLocked(k)) continue;
    evict(k);
    // Its step is no longer whole here: its manifest goes with it, so that
    // nobody takes the step for whole.
    const ReplicaKey manifest{k.job_id, k.uid, k.rank, k.step, format::ManifestFileName(k.rank)};
    if (held_.count(manifest) > 0) evict(manifest);
  }
  if (!fits()) {
    const std::string limit =
        cap < budget_bytes_
            ? absl::StrCat(cap, " bytes that the staging budget leaves for replicas beside its "
                                "trainers' staging (of a replica budget of ",
                           budget_bytes_, "; raise staging_budget_bytes)")
            : absl::StrCat(budget_bytes_, " bytes for replicas (raise peer.replica_budget_bytes)");
    return absl::ResourceExhaustedError(absl::StrCat(
        "no room for a piece of ", n, " bytes of step ", key.step, ": this zccd holds ",
        bytes_held_, " bytes of replicas, none of which may give way to it (newer steps, the "
        "newest step each rank has whole here, the job's newest step whole in the tier)",
        incoming_bytes_ > 0
            ? absl::StrCat(", and ", incoming_bytes_, " bytes of pieces being received")
            : std::string(),
        ", in the ", limit));
  }
  for (const ReplicaKey& k : victims) DropLocked(k, freed);
  pieces_dropped_ += victims.size();
  return absl::OkStatus();
}

absl::Status ReplicaStore::PutLocked(std::shared_ptr<const Replica> piece, uint64_t cap,
                                     std::vector<std::shared_ptr<const void>>* freed) {
  const ReplicaKey& key = piece->info.key;
  const uint64_t n = piece->bytes.size();
  uint64_t replaced = 0;
  if (auto it = held_.find(key); it != held_.end()) replaced = it->second->bytes.size();
  if (absl::Status made = MakeRoomLocked(key, n, replaced, cap, /*verified=*/true, freed);
      !made.ok()) {
    freed->push_back(std::move(piece));  // (its bytes, freed after the lock)
    return made;
  }
  DropLocked(key, freed);
  by_age_.emplace(AgeOf(*piece), key);
  bytes_held_ += n;
  if (piece->info.own) {
    own_bytes_held_ += n;
    ++own_pieces_held_;
  }
  if (IsManifest(key)) whole_[std::make_tuple(key.job_id, key.uid, key.rank)].insert(key.step);
  held_.emplace(key, std::move(piece));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Replica>> ReplicaStore::Get(const ReplicaKey& key) const {
  zcc::MutexLock lock(&mu_);
  auto it = held_.find(key);
  if (it == held_.end()) {
    return absl::NotFoundError(absl::StrCat("no replica of ", key.job_id, " rank ", key.rank,
                                            " step ", key.step, " piece '", key.piece, "'"));
  }
  return it->second;
}

std::vector<ReplicaInfo> ReplicaStore::List(const std::string& job_id, uint32_t uid) const {
  std::vector<ReplicaInfo> out;
  zcc::MutexLock lock(&mu_);
  for (auto it = held_.lower_bound(ReplicaKey{job_id, uid, 0, INT64_MIN, ""});
       it != held_.end() && it->first.job_id == job_id && it->first.uid == uid; ++it) {
    out.push_back(it->second->info);
  }
  return out;
}

void ReplicaStore::Pin(const std::string& job_id, uint32_t uid, int64_t step) {
  zcc::MutexLock lock(&mu_);
  if (step < 0) {
    pinned_.erase({job_id, uid});
  } else {
    pinned_[{job_id, uid}] = step;
  }
}

bool ReplicaStore::PinIfNewer(const std::string& job_id, uint32_t uid, int64_t step,
                              bool may_move_back, std::optional<uint64_t> as_of) {
  zcc::MutexLock lock(&mu_);
  if (as_of.has_value()) {
    auto went_back = went_back_count_.find({job_id, uid});
    if (went_back != went_back_count_.end() && went_back->second != *as_of) return false;
  }
  auto it = pinned_.find({job_id, uid});
  if (it != pinned_.end() && (step == it->second || (!may_move_back && step < it->second))) {
    return false;
  }
  pinned_[{job_id, uid}] = step;
  return true;
}

uint64_t ReplicaStore::went_back_count(const std::string& job_id, uint32_t uid) const {
  zcc::MutexLock lock(&mu_);
  auto it = went_back_count_.find({job_id, uid});
  return it == went_back_count_.end() ? 0 : it->second;
}

std::optional<int64_t> ReplicaStore::pinned(const std::string& job_id, uint32_t uid) const {
  zcc::MutexLock lock(&mu_);
  auto it = pinned_.find({job_id, uid});
  if (it == pinned_.end()) return std::nullopt;
  return it->second;
}

bool ReplicaStore::PinnedLocked(const ReplicaKey& key) const {
  auto it = pinned_.find({key.job_id, key.uid});
  return it != pinned_.end() && it->second == key.step;
}

uint64_t ReplicaStore::ShrinkTo(uint64_t target, const std::string& job_id, uint32_t uid,
                                std::vector<std::shared_ptr<const void>>* freed) {
  uint64_t dropped = 0;
  Held held;
  {
    zcc::MutexLock lock(&mu_);
    auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return bytes_held_ + incoming_bytes_ > target;
    };
    // Which turn a piece goes in (ShrinkTo's order in the header; turn 3
    // is the room of pieces being received).
    auto turn = [&](const ReplicaKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const bool pinned = PinnedLocked(k);
      if (SupersededLocked(k) && !pinned) return 0;
      if (!WholeLocked(k) && !pinned) return 1;
      return k.job_id == job_id && k.uid == uid ? 4 : 2;
    };
    for (int pass = 0; pass < 5 && over(); ++pass) {
      if (pass == 3) {
        // Other jobs' first, then the registering job's; the oldest step
        // first in each.
        std::vector<Incoming*> rooms(incoming_.begin(), incoming_.end());
        auto order = [&](const Incoming* r) {
          return std::make_tuple(r->key_.job_id == job_id && r->key_.uid == uid, r->key_.step,
                                 r->key_);
        };
        std::sort(rooms.begin(), rooms.end(),
                  [&](const Incoming* a, const Incoming* b) { return order(a) < order(b); });
        for (Incoming* room : rooms) {
          if (!over()) break;
          room->revoked_.store(true, std::memory_order_release);
          UncountLocked(room);
          dropped += room->bytes_;
          ZCC_LOG(WARNING) << "peer: the room of piece '" << room->key_.piece << "' of job "
                           << room->key_.job_id << " rank " << room->key_.rank << " step "
                           << room->key_.step << " (" << room->bytes_
                           << " bytes), being received, is taken back for a trainer's "
                              "registration";
        }
        continue;
      }
      // Each drop may move others to an earlier turn (a manifest gone makes
      // its step part-received): the scan starts again after each.
      bool more = true;
      while (more && over()) {
        more = false;
        for (const auto& [age, k] : by_age_) {
          if (turn(k) > pass) continue;
          // Its step is no longer whole here: its manifest goes with it.
          const ReplicaKey piece = k;
          const ReplicaKey manifest{piece.job_id, piece.uid, piece.rank, piece.step,
                                    format::ManifestFileName(piece.rank)};
          for (const ReplicaKey& gone : {manifest, piece}) {
            auto it = held_.find(gone);
            if (it == held_.end()) continue;
            dropped += it->second->bytes.size();
            DropLocked(gone, freed);
            ++pieces_dropped_;
          }
          more = true;
          break;
        }
      }
    }
    held = HeldLocked();
  }
  if (dropped > 0) Changed(held);
  return dropped;
}

ReplicaStore::Held ReplicaStore::held() const {
  zcc::MutexLock lock(&mu_);
  return HeldLocked();
}

uint64_t ReplicaStore::bytes_held() const {
  zcc::MutexLock lock(&mu_);
  return bytes_held_ + incoming_bytes_;
}

uint64_t ReplicaStore::pieces_dropped() const {
  zcc::MutexLock lock(&mu_);
  return pieces_dropped_;
}

}  // namespace zcc::daemon::peer
