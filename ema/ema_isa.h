// Instruction-set levels of the EMA kernels and the one place that decides
// which of them this CPU can run. The CPU is probed once per process
// (__builtin_cpu_supports, which also checks that the OS saves the wide
// registers); the binary itself is built without any -m flags, so it runs on
// any x86-64 CPU and picks its kernels at run time.
//
// ZCC_EMA_ISA=scalar|avx2|avx512 in the environment selects a level in place
// of the best one (to test or benchmark the lower levels on a CPU that has the
// higher ones). Thread-safe: every function may be called from any thread.
#ifndef ZCC_EMA_EMA_ISA_H_
#define ZCC_EMA_EMA_ISA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::ema {

enum class Isa : uint8_t {
  kAuto,    // ZCC_EMA_ISA when set, else the best level this CPU supports.
  kScalar,  // Portable C++.
  kAvx2,    // AVX2 + FMA + F16C.
  kAvx512,  // AVX-512 F + BW.
};

// "auto", "scalar", "avx2", "avx512".
absl::string_view IsaName(Isa isa);

// Inverse of IsaName; InvalidArgument for anything else.
absl::StatusOr<Isa> ParseIsaName(absl::string_view name);

// Whether this CPU (and OS) can run kernels of `isa`. kAuto and kScalar: always.
bool IsaSupported(Isa isa);

// The highest level IsaSupported() accepts.
Isa BestSupportedIsa();

// The level to run: `requested` itself when it is not kAuto; for kAuto the
// level named by ZCC_EMA_ISA when that is set and not empty, else
// BestSupportedIsa(). InvalidArgument when ZCC_EMA_ISA names no level, or the
// chosen level is one this CPU cannot run (a forced level is never silently
// replaced by another).
absl::StatusOr<Isa> ResolveIsa(Isa requested);

}  // namespace zcc::ema

#endif  // ZCC_EMA_EMA_ISA_H_
