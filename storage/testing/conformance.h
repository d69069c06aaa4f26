// The contract every Storage keeps (storage/storage.h), as one check run
// against each backend: queued direct writes and reads, buffered files at
// any offset, names (rename where the backend has it; a backend without it,
// an object store, must write whole files atomically instead), stat, list,
// exchange, tree removal.
#ifndef ZCC_STORAGE_TESTING_CONFORMANCE_H_
#define ZCC_STORAGE_TESTING_CONFORMANCE_H_

#include <cstdint>
#include <string>

#include "storage/aligned_buffer.h"
#include "storage/storage.h"

namespace zcc::storage::testing {

// Runs the whole contract inside directory `dir` (made if missing), leaving
// nothing behind. Fails the current Catch2 test on any breach.
void CheckStorageConformance(Storage& storage, const std::string& dir);

// `n` bytes of a pseudo-random pattern of `seed`, in aligned memory.
AlignedBuffer Pattern(size_t n, uint32_t seed);
OpenOptions Direct(uint32_t queue_depth);
std::string AsString(const uint8_t* p, size_t n);

}  // namespace zcc::storage::testing

#endif  // ZCC_STORAGE_TESTING_CONFORMANCE_H_
