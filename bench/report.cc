#include "bench/report.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace zcc::bench {

void Emit(Row row) {
  if (row.ratio == 0 && row.reference != 0) row.ratio = row.value / row.reference;
  std::printf("BENCH_ROW {\"name\": \"%s\", \"value\": %.6g, \"reference\": %.6g, "
              "\"ratio\": %.4f, \"target\": \"%s\", \"unit\": \"%s\"}\n",
              absl::CEscape(row.name).c_str(), row.value, row.reference, row.ratio,
              absl::CEscape(row.target).c_str(), absl::CEscape(row.unit).c_str());
  std::fflush(stdout);
}

std::vector<int> CountsFromEnv(const char* env, std::vector<int> defaults) {
  const char* c = std::getenv(env);
  if (c == nullptr || *c == '\0') return defaults;
  std::vector<int> counts;
  for (const char* p = c; *p;) {
    counts.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return counts;
}

bool QuickMode(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) return true;
  }
  return false;
}

}  // namespace zcc::bench
