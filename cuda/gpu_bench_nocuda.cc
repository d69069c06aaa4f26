// gpu_bench in a build without CUDA (--config=nocuda): nothing to measure.
#include <cstdio>

int main() {
  std::printf("gpu_bench: skipped: no CUDA device: built with --config=nocuda\n");
  return 0;
}
