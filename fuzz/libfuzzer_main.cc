// libFuzzer entry for one target of fuzz_targets.h, chosen at compile time:
//   clang++ -DZCC_FUZZ_ENTRY=FuzzSafetensorsHeader -fsanitize=fuzzer ... libfuzzer_main.cc
// fuzz/build.sh builds one binary per target this way.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"

#ifndef ZCC_FUZZ_ENTRY
#error "define ZCC_FUZZ_ENTRY to one of the entry points in fuzz/fuzz_targets.h"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return zcc::fuzz::ZCC_FUZZ_ENTRY(data, size);
}
