// How much device memory a process holds on a GPU, as NVML reports it: zccd's
// status shows what its daemon-pull context costs on each device. NVML
// (libnvidia-ml.so.1, part of the driver) is loaded at run time, so nothing
// links against it and machines without a driver simply report 0.
#ifndef ZCC_CUDA_NVML_MEMORY_H_
#define ZCC_CUDA_NVML_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace zcc {

// Bytes of device memory process `pid` uses on the GPU at PCI address
// `pci_bus_id` ("0000:3b:00.0"); 0 when NVML is missing, the GPU is unknown
// or the process holds nothing there. Thread-safe.
uint64_t NvmlProcessMemory(const std::string& pci_bus_id, pid_t pid);

}  // namespace zcc

#endif  // ZCC_CUDA_NVML_MEMORY_H_
