// Reads a rank's tensors back from a committed step into a fresh shared-memory
// restore buffer. Every registered tensor (a box of a global tensor) is
// filled through the step's global index from the saved pieces that overlap
// it: pieces written by any rank of any layout (a replicated tensor was
// written by whichever member of its group the shard assigner picked; a job
// may restore with another world size or parallel layout).
//
// Thread-safety: stateless, besides the SharedReads a caller passes.
#ifndef ZCC_DAEMON_RESTORE_RESTORER_H_
#define ZCC_DAEMON_RESTORE_RESTORER_H_

#include <sys/types.h>

#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "daemon/rank/rank_session.h"
#include "daemon/restore/shared_reads.h"
#include "shm/segment.h"

namespace zcc::daemon {

struct RestoreBuffer {
  shm::Segment segment;
  uint64_t data_offset = 0;           // from the segment start
  std::vector<uint64_t> offsets;      // per registered tensor, from data_offset
  std::vector<bool> restored;         // per registered tensor: in the buffer
  uint64_t bytes_read = 0;            // tensor bytes read from the step (and checked)
};

// Creates segment `shm_name` (mode 0600, owned by `owner`: see
// RankSessionOptions::segment_owner), sized for all of `registered`, and
// fills it from `step_dir` (a committed step whose metadata was checked:
// checkpoint::CheckStepMetadata, which gave `step`, its grouped index),
// reading each piece it needs once, through `io`, and checking its checksum
// as it arrives. DataLoss names a piece that does not match its checksum;
// FailedPrecondition a tensor that the checkpoint lacks or holds with
// another dtype or global shape. On any error the segment is removed before
// returning: nothing of the step reaches the trainer. Logs its progress every
// few seconds while it reads. Cancelled once `cancelled()` turns true. `owned_only`: only the staged tensors (this rank
// writes them; replicas another rank writes are left out). `shared`: the
// ranks restoring the step on this node at the same time read each box once
// between them (daemon/restore/shared_reads.h); bytes_read counts this rank's reads.
// `make_segment` makes the segment (its name, size and owner; zero memory, as
// shm::Segment::Create's, which it is when null): memory made ready before,
// from zccd's staging pool.
using MakeSegment =
    std::function<absl::StatusOr<shm::Segment>(const std::string& name, uint64_t bytes, uid_t owner)>;
absl::StatusOr<RestoreBuffer> ReadRestoreBuffer(const std::string& step_dir,
                                                const checkpoint::GroupedIndex& step,
                                                const std::vector<RegisteredTensor>& registered,
                                                const std::string& shm_name,
                                                uint64_t max_bytes, uid_t owner,
                                                const checkpoint::IoOptions& io,
                                                const std::function<bool()>& cancelled = nullptr,
                                                bool owned_only = false,
                                                SharedReads* shared = nullptr,
                                                const MakeSegment& make_segment = nullptr);

// Reads the staged tensors of `registered` (those this rank writes) from
// `step_dir` into the staging slot at `slot`, at their slot offsets, like
// ReadRestoreBuffer; returns the bytes read. On an error the slot holds a
// partial read: the caller frees it without handing it out. `checked` (when
// given) is called with the index into `registered` of each tensor whose bytes
// are in the slot and match their checksums, as the read goes on (from the
// reading thread), so that they can be copied out before the rest is read.
absl::StatusOr<uint64_t> ReadIntoSlot(
    const std::string& step_dir, const checkpoint::GroupedIndex& step,
    const std::vector<RegisteredTensor>& registered, uint8_t* slot,
    const checkpoint::IoOptions& io, const std::function<bool()>& cancelled = nullptr,
    const std::function<void(size_t registered)>& checked = nullptr);

// The optional tensors of `registered` (RegisteredTensor::optional) that
// `step` does not hold, in registration order: the reads above fill them
// with zeros.
std::vector<std::string> MissingOptional(const checkpoint::GroupedIndex& step,
                                         const std::vector<RegisteredTensor>& registered);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_RESTORER_H_
