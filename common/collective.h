// A collective of a job's ranks that a restore shares its reads through
// (RestoreOptions::collective, client/client.h). It lives here, below both
// the client that uses it and the implementations (cuda/, client/): every replica restores from its zccd only the
// pieces it writes, and the others arrive from their writers through the
// collective, so a job reads each replicated piece once. The trainer brings
// it: an NCCL communicator it already has (cuda/nccl_collective.h), or, for
// host tensors, TcpCollective (client/tcp_collective.h).
//
// Every call is collective: all members call it, in the same order, with the
// same arguments where they must agree (bytes, root). An implementation that
// fails a call (a member gone, a timeout) returns an error on the members it
// can tell; callers treat the collective as broken after any error.
#ifndef ZCC_COMMON_COLLECTIVE_H_
#define ZCC_COMMON_COLLECTIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;

  // Every member's `mine`, indexed by rank (small messages: step lists,
  // which pieces a member restored).
  virtual absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view mine) = 0;

  // `bytes` bytes from member `root`'s `data` into every other member's
  // `data`, ordered on `stream` (device implementations). `data` is memory
  // the member registered (host or device, as the implementation handles);
  // nullptr on a member that does not keep the bytes (it still takes part).
  virtual absl::Status Broadcast(void* data, uint64_t bytes, uint32_t root, void* stream) = 0;

  // Several broadcasts from one root, in order: each region as Broadcast
  // moves it. By default one Broadcast each; an implementation whose calls
  // cost more than their bytes (a Python one over torch.distributed) packs
  // them into one.
  struct Region {
    void* data = nullptr;  // nullptr: as in Broadcast
    uint64_t bytes = 0;
  };
  virtual absl::Status BroadcastMany(const std::vector<Region>& regions, uint32_t root,
                                     void* stream) {
    for (const Region& r : regions) {
      absl::Status st = Broadcast(r.data, r.bytes, root, stream);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
};

}  // namespace zcc

#endif  // ZCC_COMMON_COLLECTIVE_H_
