// The GPU checks (gpu_bench, daemon_pull_bench, nccl_restore_check) in a build
// without CUDA (--config=nocuda): nothing to measure or check.
#include <cstdio>

int main(int, char** argv) {
  std::printf("%s: skipped: no CUDA device: built with --config=nocuda\n", argv[0]);
  return 0;
}
