# Sourced by the scripts in tools/: Bazel flags for this machine.
# Builds the CUDA backend when nvcc is installed, its CPU-only stand-in otherwise.
ZCC_BAZEL_FLAGS=()
if ! command -v nvcc >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  ZCC_BAZEL_FLAGS+=(--config=nocuda)
fi
