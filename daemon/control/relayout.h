// A job resumed on this node in another layout (another world size, or other
// tensors on every rank) while its previous layout's snapshots are still in
// zccd's memory. No rank of the new layout can adopt them (a restore from
// memory needs the same rank and the same tensors), so before the new layout
// restores, the newest step that every previous rank left in memory, when
// newer than what the job's directory holds, is written there as an ordinary
// committed step, as each rank's checkpoint write makes it (from its slot,
// with its I/O, EMA included). The restore then reads it as any step from
// disk: into any layout, every tensor checked, with the usual fallback. The
// steps since the last disk checkpoint are not lost to the change of layout.
//
// Thread-safety: stateless; the caller writes a previous layout once (the
// registration it was handed to, JobTable::Admit) while the job's restores
// wait (Job::AwaitRelayout).
#ifndef ZCC_DAEMON_CONTROL_RELAYOUT_H_
#define ZCC_DAEMON_CONTROL_RELAYOUT_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "daemon/jobs/job_table.h"
#include "storage/storage.h"

namespace zcc::daemon {

// Writes and commits into the job's directory the newest step all of the
// previous layout's ranks retain, when it is newer than the directory's
// newest committed step; returns that step, or nullopt when there is none (a
// rank retained nothing, no common step, or nothing newer: each logged).
// `storage` null: the default POSIX storage.
absl::StatusOr<std::optional<int64_t>> PersistRetainedStep(const PreviousLayout& previous,
                                                           storage::Storage* storage);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_RELAYOUT_H_
