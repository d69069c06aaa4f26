// zccd maps memory that other processes can cut short: a trainer owns its
// staging segment and its restore buffers (the files are chowned to it so
// that it can map them), and may ftruncate them. An access to a mapped page
// past the new end raises SIGBUS, and, unhandled, that ended zccd and every
// job's snapshots in it.
//
// Once InstallTruncationGuard has run, every shm::Segment mapping of the
// process is registered here. A SIGBUS inside one replaces that whole
// mapping with anonymous zero pages (as if the other process had written
// zeros, which it could have done anyway) and marks it cut; the access
// retries and goes on. The segment's owner is told by Segment::cut(), and
// zccd drops the registration with the reason. A SIGBUS anywhere else is
// what it was: the process ends with it.
//
// Thread-safety: the table is lock-free (the signal handler reads it); a
// mapping is registered and removed by its one owner.
#ifndef ZCC_SHM_TRUNCATION_GUARD_H_
#define ZCC_SHM_TRUNCATION_GUARD_H_

#include <cstdint>

#include "absl/status/status.h"

namespace zcc::shm {

// Installs the SIGBUS handler (idempotent: again only where another
// handler replaced it since). zccd's main calls it first thing; a client
// process does not (the daemon never cuts its segments). A SIGBUS outside
// the guarded mappings goes to the handler it replaced, or, where that was
// the default, ends the process.
absl::Status InstallTruncationGuard();
// Whether the handler is the one in place.
bool TruncationGuardInstalled();

namespace internal {
// The guarded mappings, for shm::Segment. Guard returns a handle, or -1
// when the guard is not installed or the table (4096 mappings) is full.
int GuardMapping(void* addr, uint64_t bytes);
// The mapping is about to shrink to `bytes` (Segment::Resize; before the
// tail is unmapped). A mapping that moves is unguarded and guarded again.
void ShrinkGuardedMapping(int handle, uint64_t bytes);
// Whether the mapping was cut (its pages are anonymous zeros now).
bool GuardedMappingCut(int handle);
// Before the mapping is unmapped.
void UnguardMapping(int handle);
}  // namespace internal

}  // namespace zcc::shm

#endif  // ZCC_SHM_TRUNCATION_GUARD_H_
