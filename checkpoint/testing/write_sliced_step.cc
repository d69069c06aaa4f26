// Writes and commits one step of a sliced model (checkpoint/testing/
// sliced_step.h) under JOB_DIR and prints the step directory.
//
//   write_sliced_step JOB_DIR [--job ID] [--step N] [--world W] [--layers L]
//                     [--hidden H] [--intermediate I] [--vocab V]
//                     [--no-optim] [--no-ema]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/testing/sliced_step.h"
#include "common/file_util.h"
#include "format/manifest.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: write_sliced_step JOB_DIR [--job ID] [--step N] [--world W] [--layers L]\n"
               "       [--hidden H] [--intermediate I] [--vocab V] [--no-optim] [--no-ema]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  zcc::checkpoint::testing::SlicedModel model;
  std::string job_dir, job = "job";
  int64_t step = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto number = [&](auto* out) {
      return i + 1 < argc && absl::SimpleAtoi(argv[++i], out);
    };
    bool ok = true;
    if (a == "--job" && i + 1 < argc) {
      job = argv[++i];
    } else if (a == "--step") {
      ok = number(&step);
    } else if (a == "--world") {
      ok = number(&model.world);
    } else if (a == "--layers") {
      ok = number(&model.layers);
    } else if (a == "--hidden") {
      ok = number(&model.hidden);
    } else if (a == "--intermediate") {
      ok = number(&model.intermediate);
    } else if (a == "--vocab") {
      ok = number(&model.vocab);
    } else if (a == "--no-optim") {
      model.optim = false;
    } else if (a == "--no-ema") {
      model.ema = false;
    } else if (job_dir.empty() && !a.empty() && a[0] != '-') {
      job_dir = a;
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (job_dir.empty()) return Usage();
  const absl::Status st = zcc::checkpoint::testing::WriteSlicedStep(job_dir, job, step, model);
  if (!st.ok()) {
    std::fprintf(stderr, "write_sliced_step: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", zcc::JoinPath(job_dir, zcc::format::StepDirName(step)).c_str());
  return 0;
}
