// The source side of the DeviceCopier conformance suite on a real GPU: the
// trainer's tensors in device memory, written by stream-ordered uploads
// behind a spinning kernel, so that a copy not ordered after the trainer's
// work, or an update not fenced behind a copy, visibly corrupts the bytes.
// Shared by the CUDA copier's and daemon-pull's GPU tests. Test-only; CUDA
// builds only (cuda_test_support).
#ifndef ZCC_CUDA_DEVICE_SOURCES_H_
#define ZCC_CUDA_DEVICE_SOURCES_H_

#include "copy/copier_conformance.h"

namespace zcc::cuda_testing {

// Sets env's alloc_source, free_source, write_source, read_source and
// stall_stream (the uploads go through a 96 MiB pinned arena it owns).
void UseDeviceSources(testing::CopierConformanceEnv* env);

}  // namespace zcc::cuda_testing

#endif  // ZCC_CUDA_DEVICE_SOURCES_H_
