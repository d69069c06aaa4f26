// One benchmark row, printed in the form bench/run.sh collects: a line
// "BENCH_ROW <json>" on stdout with the fields name, value, reference, ratio,
// target and unit. ratio = value / reference, oriented so that higher is
// better (a row whose name says otherwise documents it).
#ifndef ZCC_BENCH_REPORT_H_
#define ZCC_BENCH_REPORT_H_

#include <string>
#include <vector>

namespace zcc::bench {

struct Row {
  std::string name;
  double value = 0;
  double reference = 0;
  double ratio = 0;    // computed by Emit when left 0 and reference != 0
  std::string target;  // e.g. ">= 0.9"; empty when the row only informs
  std::string unit;    // unit of value and reference, e.g. "GB/s", "us"
};

// Prints the row as a BENCH_ROW line (and flushes).
void Emit(Row row);

// True when argv holds --quick (the ~1 minute version).
bool QuickMode(int argc, char** argv);

// The counts a benchmark sweeps: `defaults`, or the comma-separated list in
// environment variable `env` when it is set (a debugging aid).
std::vector<int> CountsFromEnv(const char* env, std::vector<int> defaults);

}  // namespace zcc::bench

#endif  // ZCC_BENCH_REPORT_H_
