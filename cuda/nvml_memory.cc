#include "cuda/nvml_memory.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace zcc {
namespace {

// The few NVML declarations used here (nvml.h is not part of the toolkit
// installed on build machines). Layouts as in nvml.h.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*by_pci)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*processes)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  bool ok = false;
};

const Nvml& LoadNvml() {
  static Nvml nvml;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    nvml.init = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib, "nvmlInit_v2"));
    nvml.by_pci = reinterpret_cast<NvmlReturn (*)(const char*, NvmlDevice*)>(
        dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    nvml.processes = reinterpret_cast<NvmlReturn (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*)>(
        dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
    nvml.ok = nvml.init != nullptr && nvml.by_pci != nullptr && nvml.processes != nullptr &&
              nvml.init() == kNvmlSuccess;
  });
  return nvml;
}

}  // namespace

uint64_t NvmlProcessMemory(const std::string& pci_bus_id, pid_t pid) {
  const Nvml& nvml = LoadNvml();
  if (!nvml.ok) return 0;
  NvmlDevice device = nullptr;
  if (nvml.by_pci(pci_bus_id.c_str(), &device) != kNvmlSuccess) return 0;
  std::vector<NvmlProcessInfo> infos(16);
  unsigned int count = static_cast<unsigned int>(infos.size());
  NvmlReturn r = nvml.processes(device, &count, infos.data());
  if (r == kNvmlInsufficientSize) {
    infos.resize(count + 8);
    count = static_cast<unsigned int>(infos.size());
    r = nvml.processes(device, &count, infos.data());
  }
  if (r != kNvmlSuccess) return 0;
  for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
    if (infos[i].pid == static_cast<unsigned int>(pid)) return infos[i].used_gpu_memory;
  }
  return 0;
}

}  // namespace zcc
