#include "ema/ema_isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace zcc::ema {
namespace {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;
};

CpuFeatures ProbeCpu() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C through cpuid: clang 14's __builtin_cpu_supports does not know it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  return f;
}

const CpuFeatures& Cpu() {
  static const CpuFeatures features = ProbeCpu();
  return features;
}

}  // namespace

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<Isa> ParseIsaName(absl::string_view name) {
  for (Isa isa : {Isa::kAuto, Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name == IsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown EMA instruction set \"", name,
                                                 "\" (want auto, scalar, avx2 or avx512)"));
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return Cpu().avx2;
    case Isa::kAvx512:
      return Cpu().avx512;
  }
  return false;
}

Isa BestSupportedIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

absl::StatusOr<Isa> ResolveIsa(Isa requested) {
  Isa isa = requested;
  if (isa == Isa::kAuto) {
    const char* env = std::getenv("ZCC_EMA_ISA");
    if (env == nullptr || *env == '\0') return BestSupportedIsa();
    absl::StatusOr<Isa> parsed = ParseIsaName(env);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ZCC_EMA_ISA: ", parsed.status().message()));
    }
    isa = *parsed;
    if (isa == Isa::kAuto) return BestSupportedIsa();
  }
  if (!IsaSupported(isa)) {
    return absl::InvalidArgumentError(
        absl::StrCat("this CPU cannot run the ", IsaName(isa),
                     " EMA kernels (best available: ", IsaName(BestSupportedIsa()), ")"));
  }
  return isa;
}

}  // namespace zcc::ema
