// Pieces pushed in parts (proto/peer.proto, ReplicaHeader.offset/length):
// one large file of a rank's step goes to a buddy over several connections
// at once, each part its own call. Each part's bytes are written into the
// piece's buffer as they arrive (parts never overlap, so without a lock);
// the part that completes the piece checks the whole against its XXH3 and
// hands it over to be kept. A piece none of whose parts arrived for `idle`
// is dropped (DropIdle, at every part and every peer's Hello: its pusher
// gave up, and pushes the step again). A part of a piece kept in the last
// `idle` is answered as kept, without a buffer (a push tried again whose
// other parts completed the piece before it). The pieces being assembled
// are bounded in bytes, together, and in parts each. Each peer's pieces
// are its own.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_PIECE_ASSEMBLY_H_
#define ZCC_DAEMON_PEER_PIECE_ASSEMBLY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer {

class PieceAssembly {
 public:
  explicit PieceAssembly(absl::Duration idle = absl::Minutes(10)) : idle_(idle) {}

  // The piece a part belongs to, as its header names it, and who sends it.
  struct Whole {
    ReplicaKey key;
    uint64_t nbytes = 0;
    uint64_t xxh3 = 0;
    std::string from;
  };
  using Id = std::tuple<ReplicaKey, uint64_t, uint64_t, std::string>;
  // A part under way: write its `length` bytes at `data`, then End it. Null
  // `data`: the piece was kept already (read the part's bytes, keep nothing).
  struct Part {
    Id id;
    uint64_t offset = 0;
    uint64_t length = 0;
    char* data = nullptr;
    // The piece's room in the store (Begin's `reserve`), if any: once
    // revoked, the part's receiving ends.
    std::shared_ptr<const ReplicaStore::Incoming> room;
  };
  // Takes the room of a new piece in the replica store.
  using Reserve = std::function<absl::StatusOr<std::shared_ptr<ReplicaStore::Incoming>>()>;
  // A piece its last part completed, its bytes checked.
  struct Assembled {
    std::string bytes;
    std::shared_ptr<ReplicaStore::Incoming> room;  // for ReplicaStore::Put
  };
  static constexpr size_t kMaxParts = 4096;  // of one piece

  // Begins part [offset, offset + length) of `whole`. A part that arrived
  // before is taken again (a push of the step tried again after another
  // part failed). A new piece's first part takes its room with `reserve`
  // (when given; outside the lock, its other parts waiting for it) before
  // its buffer is made. Refused: a part out of the
  // piece's bounds, overlapping another or under way already, a new piece
  // that would take the pieces being assembled past `max_bytes` together
  // or that `reserve` refuses, a piece whose room was revoked (it goes).
  absl::StatusOr<Part> Begin(const Whole& whole, uint64_t offset, uint64_t length,
                             uint64_t max_bytes, const Reserve& reserve = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `part`: `written`, all its bytes are there; otherwise it is taken
  // back (a push that failed may send it again; a piece whose room was
  // revoked goes once no part is under way). Returns the whole piece when
  // this part completed it and its bytes match the piece's XXH3 (DataLoss,
  // and the piece dropped, when they do not); nullopt while parts are
  // missing.
  absl::StatusOr<std::optional<Assembled>> End(const Part& part, bool written)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The piece End handed over is kept: its late parts are answered so (and
  // one a late part began anew meanwhile goes).
  void Kept(const Id& id) ABSL_LOCKS_EXCLUDED(mu_);
  // No longer kept (the store dropped it: a push of it again is a new one).
  void Forget(const Id& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the pieces no part of which arrived for `idle`, and those whose
  // room was revoked, where no part is under way.
  void DropIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // Pieces being assembled, and their bytes.
  size_t pieces() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    std::string bytes;
    uint64_t arrived = 0;  // bytes of the parts ended written
    struct Range {
      uint64_t from, to;
      bool written;
    };
    std::vector<Range> parts;  // begun and not taken back
    int under_way = 0;
    bool allocating = true;  // its room and buffer are being made (without mu_)
    absl::Status failed;     // why they could not be: the piece is gone
    absl::Time last;  // the last part's beginning or end
    std::shared_ptr<ReplicaStore::Incoming> room;  // (null without `reserve`)
    bool revoked() const { return room != nullptr && room->revoked(); }
  };
  // Drops what DropIdle drops; their buffers go to `gone`, to be freed
  // after the lock.
  void DropIdleLocked(absl::Time now, std::vector<std::shared_ptr<Pending>>* gone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_;
  mutable zcc::Mutex mu_;
  // (Shared with the parts waiting for its buffer.)
  std::map<Id, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Id, absl::Time> kept_ ABSL_GUARDED_BY(mu_);  // when, for `idle`
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PIECE_ASSEMBLY_H_
