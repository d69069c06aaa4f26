#include "daemon/peer/piece_assembly.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "format/checksum.h"

namespace zcc::daemon::peer {

absl::StatusOr<PieceAssembly::Part> PieceAssembly::Begin(const Whole& whole, uint64_t offset,
                                                         uint64_t length, uint64_t max_bytes,
                                                         const Reserve& reserve) {
  if (length == 0 || offset > whole.nbytes || length > whole.nbytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "part [", offset, ", +", length, ") of piece '", whole.key.piece, "' is not within its ",
        whole.nbytes, " bytes"));
  }
  Part part;
  part.id = Id{whole.key, whole.nbytes, whole.xxh3, whole.from};
  part.offset = offset;
  part.length = length;
  const uint64_t end = offset + length;
  std::vector<std::shared_ptr<Pending>> gone;  // freed after the lock
  std::shared_ptr<Pending> p;
  bool first = false;
  {
    zcc::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    auto it = pending_.find(part.id);
    if (it != pending_.end() && it->second->revoked()) {
      // Said so, and it goes (DropIdleLocked's turn, once no part is
      // under way): its push tried again begins it anew.
      DropIdleLocked(now, &gone);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the room of piece '", whole.key.piece, "' was taken back for a trainer's "
          "registration: its parts are dropped"));
    }
    DropIdleLocked(now, &gone);
    if (kept_.count(part.id) > 0) return part;  // (data null: kept already)
    it = pending_.find(part.id);
    first = it == pending_.end();
    if (first) {
      if (whole.nbytes > max_bytes || bytes_ > max_bytes - whole.nbytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "piece '", whole.key.piece, "' of ", whole.nbytes, " bytes pushed in parts: the "
            "pieces being assembled here would pass the ", max_bytes, " bytes left for them"));
      }
      // (Its room and buffer are made below, without mu_: its other parts
      // wait for them.)
      it = pending_.emplace(part.id, std::make_shared<Pending>()).first;
      bytes_ += whole.nbytes;
    }
    p = it->second;
    bool again = false;
    for (Pending::Range& r : p->parts) {
      if (r.from == offset && r.to == end && r.written) {
        // Sent again: counted again when it ends.
        r.written = false;
        p->arrived -= length;
        again = true;
        break;
      }
      if (offset < r.to && r.from < end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "part [", offset, ", +", length, ") of piece '", whole.key.piece, "' overlaps one ",
            r.written ? "already pushed" : "under way"));
      }
    }
    if (!again) {
      if (p->parts.size() >= kMaxParts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "piece '", whole.key.piece, "' pushed in more than ", kMaxParts, " parts"));
      }
      p->parts.push_back({offset, end, false});
    }
    ++p->under_way;
    p->last = now;
  }
  if (first) {
    // The piece's room in the store (which may drop pieces for it), then
    // its buffer, which takes a while to fault in: not under mu_.
    absl::StatusOr<std::shared_ptr<ReplicaStore::Incoming>> room =
        reserve ? reserve() : std::shared_ptr<ReplicaStore::Incoming>();
    std::string buffer;
    absl::Status made = room.status();
    if (made.ok()) {
      try {
        buffer.resize(whole.nbytes);
      } catch (const std::bad_alloc&) {
        made = absl::ResourceExhaustedError(absl::StrCat(
            "no memory for piece '", whole.key.piece, "' of ", whole.nbytes, " bytes"));
      }
    }
    zcc::MutexLock lock(&mu_);
    p->allocating = false;
    if (!made.ok()) {
      p->failed = made;
      pending_.erase(part.id);
      bytes_ -= whole.nbytes;
      gone.push_back(std::move(p));
      return made;
    }
    p->room = *std::move(room);
    p->bytes.swap(buffer);
  } else {
    zcc::MutexLock lock(&mu_);
    auto made = [&p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !p->allocating; };
    mu_.Await(absl::Condition(&made));
    if (!p->failed.ok()) return p->failed;
  }
  part.data = p->bytes.data() + offset;
  part.room = p->room;
  return part;
}

absl::StatusOr<std::optional<PieceAssembly::Assembled>> PieceAssembly::End(const Part& part,
                                                                          bool written) {
  if (part.data == nullptr) return std::optional<Assembled>();  // (kept already)
  std::shared_ptr<Pending> whole;  // (freed after the lock, where it goes)
  {
    zcc::MutexLock lock(&mu_);
    auto it = pending_.find(part.id);
    if (it == pending_.end()) return absl::InternalError("a part of no piece being assembled");
    Pending* p = it->second.get();  // (not dropped while a part is under way)
    --p->under_way;
    p->last = absl::Now();
    const bool kept_meanwhile = kept_.count(part.id) > 0;
    if ((kept_meanwhile || p->revoked()) && p->under_way == 0) {
      // Begun anew by a late part while the piece was being kept, or its
      // room taken back: it goes.
      bytes_ -= std::get<1>(part.id);
      whole = std::move(it->second);
      pending_.erase(it);
      if (p->revoked() && !kept_meanwhile) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the room of piece '", std::get<0>(part.id).piece, "' was taken back for a "
            "trainer's registration: its parts are dropped"));
      }
      return std::optional<Assembled>();
    }
    auto r = std::find_if(p->parts.begin(), p->parts.end(),
                          [&](const Pending::Range& x) { return x.from == part.offset; });
    if (!written) {
      if (r != p->parts.end()) p->parts.erase(r);
      return std::optional<Assembled>();
    }
    if (r != p->parts.end()) r->written = true;
    p->arrived += part.length;
    if (p->arrived < std::get<1>(part.id)) return std::optional<Assembled>();
    whole = std::move(it->second);
    bytes_ -= std::get<1>(part.id);
    pending_.erase(it);
  }
  const ReplicaKey& key = std::get<0>(part.id);
  if (format::Xxh3(whole->bytes.data(), whole->bytes.size()) != std::get<2>(part.id)) {
    return absl::DataLossError(absl::StrCat("piece '", key.piece, "' pushed in parts does not "
                                            "match its checksum"));
  }
  return std::optional<Assembled>(Assembled{std::move(whole->bytes), std::move(whole->room)});
}

void PieceAssembly::Kept(const Id& id) {
  std::shared_ptr<Pending> gone;  // (freed after the lock)
  zcc::MutexLock lock(&mu_);
  kept_[id] = absl::Now();
  // A late part of a push tried again may have begun the piece anew
  // meanwhile: that buffer goes (once no part writes into it).
  auto it = pending_.find(id);
  if (it != pending_.end() && it->second->under_way == 0 && !it->second->allocating) {
    bytes_ -= std::get<1>(id);
    gone = std::move(it->second);
    pending_.erase(it);
  }
}

void PieceAssembly::Forget(const Id& id) {
  zcc::MutexLock lock(&mu_);
  kept_.erase(id);
}

void PieceAssembly::DropIdle() {
  std::vector<std::shared_ptr<Pending>> gone;  // freed after the lock
  zcc::MutexLock lock(&mu_);
  DropIdleLocked(absl::Now(), &gone);
}

void PieceAssembly::DropIdleLocked(absl::Time now, std::vector<std::shared_ptr<Pending>>* gone) {
  for (auto it = kept_.begin(); it != kept_.end();) {
    it = now - it->second > idle_ ? kept_.erase(it) : std::next(it);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Pending& p = *it->second;
    const bool idle = now - p.last > idle_;
    if (p.under_way == 0 && !p.allocating && (idle || p.revoked())) {
      const ReplicaKey& key = std::get<0>(it->first);
      ZCC_LOG(WARNING) << "peer: dropped piece '" << key.piece << "' of job " << key.job_id
                       << " rank " << key.rank << " step " << key.step << ": " << p.arrived
                       << " of its " << std::get<1>(it->first) << " bytes arrived in parts, "
                       << (idle ? absl::StrCat("none for ", absl::FormatDuration(now - p.last))
                                : std::string("its room taken back for a trainer's "
                                              "registration"));
      bytes_ -= std::get<1>(it->first);
      gone->push_back(std::move(it->second));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t PieceAssembly::pieces() const {
  zcc::MutexLock lock(&mu_);
  return pending_.size();
}

uint64_t PieceAssembly::bytes() const {
  zcc::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace zcc::daemon::peer
