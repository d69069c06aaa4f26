#!/usr/bin/env bash
# GPU checks of the CUDA copy backend, in two halves, because a GPU node has
# CUDA but neither Bazel nor the gRPC/Abseil development packages, and no
# internet (../shared/BUILDING.md, "GPU nodes"):
#
#   tools/gpu/run_gpu_checks.sh bundle
#       On a build machine (Bazel, nvcc): builds //cuda:cuda_copier_test (the
#       DeviceCopier conformance suite and the CUDA checks against the real
#       copier on a real device), //tests:daemon_pull_gpu_test (the same suite
#       against daemon-pull: this process the trainer, a real zccd copying
#       over CUDA IPC), //bench/gpu:gpu_bench, //bench/gpu:daemon_pull_bench and zccd
#       with --config=opt, and
#       copies them into tools/gpu/bundle/ (gitignored) with every shared
#       library they load, except the CUDA driver (libcuda, which belongs to
#       the node's driver) and glibc / libstdc++ / libgcc_s (on every node).
#       Bazel flags: ZCC_BAZEL_OUTPUT_BASE=<dir> builds in that output base.
#
#   tools/gpu/run_gpu_checks.sh run [gpu_bench flags...]
#       On the GPU node, from the repository root, with tools/gpu/bundle/
#       carried there: runs the test and the benchmark against the bundled
#       libraries and prints their results. Without a GPU both still run and
#       say "no CUDA device" (the test's cases skip, the benchmark exits 0).
#       gpu_bench flags (defaults): --ranks (one per device) --copy_mib=2048
#       --tensor_mib=64 --chunk_mib=64 --iters=5 --param_mib=1024
#       --params_per_tensor_mib=32 --matmul_n=4096 --matmuls=4 --steps=20.
#       daemon_pull_bench (16 tensors x 64 MiB, 10 steps) reports the trainer
#       thread's µs per Snapshot and the D2H GB/s of the CUDA copier and of
#       daemon-pull through zccd, against plain pinned copies.
#       It also runs python/tests/cuda_torch_check.py (below) with the node's
#       python3 where the bundle holds zcc's modules for it (python-headers),
#       or with ZCC_GPU_PYTHON=<venv>/bin/python (PyTorch with CUDA and zcc's
#       wheel installed there): a
#       CUDA model checkpointed through zcc.torch, which picks the CUDA copier,
#       and restored on the GPU exactly; then the same with daemon-pull
#       (copier=zcc.daemon_pull(0), the wheel's zccd with --daemon_pull).
#       With the bundle's modules, where that python3 imports torchdata and
#       transformers, also bench/torch/step_cost_bench.py --device cuda:
#       Checkpointer.step's cost on a GPU trainer's thread. The GPU image has
#       transformers but not torchdata: download its wheel here (pip download
#       --no-deps --only-binary=:all: --python-version 3.12 -d WHEELS
#       torchdata==0.11.0, pure Python) and pip install it there first.
#
#   tools/gpu/run_gpu_checks.sh python-headers DIR
#       On the GPU node: copies its python3's C headers (Python.h, pyconfig.h)
#       into DIR/include (send DIR back to the build machine). GPU nodes run a
#       newer Python than Debian 12's 3.11, which zcc's wheel is built for.
#       Then `ZCC_GPU_PYTHON_INCLUDE=DIR/include ... bundle` also builds zcc's
#       extension modules for that Python (with pybind11 2.13.6 headers, which
#       it downloads once from PyPI into ~/.cache/zcc) into the bundle's
#       python/zcc, which `run` puts on the node's python3's path.
#
# Exit status: 0 when every step passed (or skipped for lack of a device).
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly BUNDLE=tools/gpu/bundle
readonly BINARIES=(cuda_copier_test gpu_bench daemon_pull_gpu_test daemon_pull_bench zccd)
# Where each is built, from the repository root's bazel-bin.
declare -A BUILT_AT=(
  [cuda_copier_test]=cuda/cuda_copier_test
  [gpu_bench]=bench/gpu/gpu_bench
  [daemon_pull_gpu_test]=tests/daemon_pull_gpu_test
  [daemon_pull_bench]=bench/gpu/daemon_pull_bench
  [zccd]=daemon/zccd
  [nccl_collective_test]=cuda/nccl_collective_test
  [nccl_restore_check]=tests/gpu/nccl_restore_check
)
# Run when the node has libnccl (218 MB: not bundled; a PyTorch environment's
# nvidia/nccl/lib on LD_LIBRARY_PATH will do).
readonly NCCL_BINARY=nccl_collective_test
# An NCCL restore of a C++ trainer (one rank per GPU, a real zccd); needs libnccl too.
readonly NCCL_RESTORE=nccl_restore_check
# Libraries the node provides and the bundle must not shadow: the CUDA driver
# (its version must match the kernel module) and the C and C++ runtimes.
readonly SYSTEM_LIBS='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia-)'

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
}

bundle() {
  local startup=()
  if [[ -n ${ZCC_BAZEL_OUTPUT_BASE:-} ]]; then
    startup+=("--output_base=$ZCC_BAZEL_OUTPUT_BASE")
  fi
  # --symlink_prefix=/: leave the workspace's bazel-* links alone.
  # --dynamic_mode=off: tests link the workspace's libraries statically, not
  # as _solib_ shared objects that live only in Bazel's runfiles.
  local flags=(--config=opt --dynamic_mode=off --symlink_prefix=/)
  bazel "${startup[@]}" build "${flags[@]}" //cuda:cuda_copier_test //bench/gpu:gpu_bench \
    "//cuda:$NCCL_BINARY" //tests:daemon_pull_gpu_test //bench/gpu:daemon_pull_bench //daemon:zccd \
    //tests/gpu:nccl_restore_check
  local bin
  bin=$(bazel "${startup[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)

  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  local name lib path
  for name in "${BINARIES[@]}" "$NCCL_BINARY" "$NCCL_RESTORE"; do
    cp "$bin/${BUILT_AT[$name]}" "$BUNDLE/bin/$name"
    chmod u+w,a+x "$BUNDLE/bin/$name"
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"
    while read -r lib _ path _; do
      if [[ $path == "not" ]]; then
        echo "bundle: $name needs $lib, which is not found here" >&2
        exit 1
      fi
      [[ $lib =~ $SYSTEM_LIBS || $lib == libnccl.so* ]] && continue
      [[ -e $BUNDLE/lib/$lib ]] || cp -L "$path" "$BUNDLE/lib/$lib"
    done < <(ldd "$BUNDLE/bin/$name" | grep '=>')
  done
  if [[ -n ${ZCC_GPU_PYTHON_INCLUDE:-} ]]; then
    bundle_python "${startup[@]}" -- "${flags[@]}"
  fi
  {
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "nvcc: $(/usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*')"
    echo "glibc: $(ldd --version | head -1)"
    # The newest symbol versions the bundle uses: the node's glibc and
    # libstdc++ must provide them (run checks with ldd).
    echo "needs on the node: $( (cd "$BUNDLE" && for f in bin/* lib/*; do objdump -T "$f"; done) |
      grep -oE '(GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | sort -u -V |
      awk -F_ '{ newest[$1] = $0 } END { for (k in newest) printf "%s ", newest[k] }')"
    echo "files:"
    (cd "$BUNDLE" && find bin lib -type f -printf '  %p %s\n' | sort)
  } >"$BUNDLE/MANIFEST"
  cat "$BUNDLE/MANIFEST"
  echo "bundle: $BUNDLE, $(du -sh "$BUNDLE" | cut -f1); carry it to the GPU node, then run:"
  echo "  tools/gpu/run_gpu_checks.sh run"
}

# zcc's extension modules for the GPU node's Python, from the headers that
# `python-headers` copied there: bundle_python STARTUP... -- FLAGS...
bundle_python() {
  local startup=() flags=()
  while [[ $1 != -- ]]; do startup+=("$1"); shift; done
  shift
  flags=("$@")
  local include=$ZCC_GPU_PYTHON_INCLUDE
  if [[ ! -f $include/Python.h ]]; then
    echo "bundle: no Python.h in ZCC_GPU_PYTHON_INCLUDE=$include" >&2
    exit 1
  fi
  # Bazel accepts absolute include paths only under the toolchain's system
  # directories: the headers are copied under /usr/local/include.
  local headers=/usr/local/include/zcc-gpu-python pybind11=$HOME/.cache/zcc/pybind11-2.13.6
  if [[ ! -d $pybind11/pybind11 ]]; then
    local wheels
    wheels=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: pybind11==2.13.6 -d "$wheels"
    mkdir -p "$pybind11"
    python3 -m zipfile -e "$wheels"/pybind11-2.13.6-*.whl "$wheels/x"
    cp -r "$wheels/x/pybind11/include/pybind11" "$pybind11/"
    rm -rf "$wheels"
  fi
  rm -rf "$headers"
  mkdir -p "$headers/python" "$headers/pybind11"
  cp -r "$include"/. "$headers/python/"
  cp -r "$pybind11/pybind11" "$headers/pybind11/"
  # -I comes before the -isystem of @zcc_python's headers (Debian's python3.11).
  local copts="--per_file_copt=python/zcc/.*\\.cc@-I$headers/python,-I$headers/pybind11"
  bazel "${startup[@]}" build "${flags[@]}" "$copts" //python/zcc:_zcc.so //python/zcc:_zcc_cuda.so
  local bin
  bin=$(bazel "${startup[@]}" info "${flags[@]}" "$copts" bazel-bin 2>/dev/null)
  mkdir -p "$BUNDLE/python/zcc"
  cp python/zcc/*.py "$bin/python/zcc/_zcc.so" "$bin/python/zcc/_zcc_cuda.so" "$BUNDLE/python/zcc/"
  chmod u+w "$BUNDLE"/python/zcc/*
  local lib path
  while read -r lib _ path _; do
    [[ $lib =~ $SYSTEM_LIBS || $lib == libcudart.so* ]] && continue
    [[ -e $BUNDLE/lib/$lib ]] || cp -L "$path" "$BUNDLE/lib/$lib"
  done < <(ldd "$BUNDLE/python/zcc/_zcc.so" | grep '=>')
  echo "bundle: zcc's modules for Python $(sed -n 's/^#define PY_VERSION *"\(.*\)".*/\1/p' "$include/patchlevel.h")" \
    "in $BUNDLE/python"
}

# On the GPU node: its python3's C headers into $1/include.
python_headers() {
  local dir=${1:?python-headers needs a folder}
  local include multiarch
  include=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("INCLUDEPY"))')
  mkdir -p "$dir/include"
  cp -rL "$include"/. "$dir/include/"
  # Debian and Ubuntu keep the real pyconfig.h under the multiarch folder.
  multiarch=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH") or "")')
  if [[ -n $multiarch && -f /usr/include/$multiarch/$(basename "$include")/pyconfig.h ]]; then
    cp -L "/usr/include/$multiarch/$(basename "$include")/pyconfig.h" "$dir/include/pyconfig.h"
  fi
  echo "python-headers: $(python3 --version) headers in $dir/include"
}

run() {
  if [[ ! -x $BUNDLE/bin/cuda_copier_test || ! -x $BUNDLE/bin/gpu_bench ]]; then
    echo "run: no bundle in $BUNDLE; build it with 'tools/gpu/run_gpu_checks.sh bundle' on a" \
      "machine with Bazel and carry $BUNDLE here" >&2
    exit 1
  fi
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== bundle"
  cat "$BUNDLE/MANIFEST"
  echo "== node"
  uname -srm
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader ||
      echo "nvidia-smi failed"
  else
    echo "nvidia-smi: not installed (no NVIDIA driver here?)"
  fi
  local name missing=0
  for name in "${BINARIES[@]}"; do
    # Captured first: `ldd | grep -q` under pipefail can fail when grep exits early.
    local unresolved
    unresolved=$(ldd "$BUNDLE/bin/$name" 2>&1 | grep 'not found' || true)
    if [[ -n $unresolved ]]; then
      echo "$name: unresolved libraries:" >&2
      echo "$unresolved" >&2
      missing=1
    fi
  done
  [[ $missing -eq 0 ]] || exit 1

  local log test_rc=0 bench_rc=0
  log=$(mktemp -d)
  echo "== cuda_copier_test (conformance suite + CUDA checks on the real device)"
  "$BUNDLE/bin/cuda_copier_test" --durations yes 2>&1 | tee "$log/test" || test_rc=${PIPESTATUS[0]}
  echo "== gpu_bench $*"
  "$BUNDLE/bin/gpu_bench" "$@" 2>&1 | tee "$log/bench" || bench_rc=${PIPESTATUS[0]}
  # Daemon-pull: this process the trainer, the bundled zccd copying over CUDA
  # IPC (found where a Bazel test finds its data: $TEST_SRCDIR/zcc/daemon/zccd).
  local pull_rc=0 pull_bench_rc=0
  mkdir -p "$BUNDLE/runfiles/zcc/daemon"
  ln -sf "$PWD/$BUNDLE/bin/zccd" "$BUNDLE/runfiles/zcc/daemon/zccd"
  echo "== daemon_pull_gpu_test (conformance suite, zccd copying over CUDA IPC)"
  TEST_SRCDIR="$PWD/$BUNDLE/runfiles" "$BUNDLE/bin/daemon_pull_gpu_test" --durations yes 2>&1 |
    tee "$log/pull" || pull_rc=${PIPESTATUS[0]}
  echo "== daemon_pull_bench"
  "$BUNDLE/bin/daemon_pull_bench" --zccd "$PWD/$BUNDLE/bin/zccd" 2>&1 | tee "$log/pull_bench" ||
    pull_bench_rc=${PIPESTATUS[0]}
  # zcc.torch with CUDA tensors: where an interpreter with PyTorch (CUDA) and
  # zcc (the wheel, tools/build_wheel.sh) is given as ZCC_GPU_PYTHON, with the
  # wheel's zccd next to it.
  local step_cost_rc=0 step_cost_result="NOT RUN (no zcc modules for this python3)"
  local torch_rc=0 torch_result="NOT RUN (no zcc modules in the bundle for this python3, and no ZCC_GPU_PYTHON: see python-headers)"
  if [[ -n ${ZCC_GPU_PYTHON:-} ]]; then
    echo "== cuda_torch_check ($ZCC_GPU_PYTHON)"
    PYTHONPATH="$PWD/python/tests" "$ZCC_GPU_PYTHON" python/tests/cuda_torch_check.py \
      --zccd "$(dirname "$ZCC_GPU_PYTHON")/zccd" 2>&1 | tee "$log/torch" || torch_rc=${PIPESTATUS[0]}
    torch_result=$([[ $torch_rc -eq 0 ]] && tail -1 "$log/torch" || echo "FAILED (exit $torch_rc)")
  elif [[ -f $BUNDLE/python/zcc/_zcc.so ]]; then
    echo "== cuda_torch_check ($(command -v python3), zcc from $BUNDLE/python)"
    # The CUDA runtime PyTorch's wheels brought, ahead of the bundle's.
    local cudart
    cudart=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
    LD_LIBRARY_PATH="${cudart:+$cudart:}$LD_LIBRARY_PATH" PYTHONUNBUFFERED=1 \
      PYTHONPATH="$PWD/$BUNDLE/python:$PWD/python/tests${PYTHONPATH:+:$PYTHONPATH}" python3 python/tests/cuda_torch_check.py \
      --zccd "$PWD/$BUNDLE/bin/zccd" 2>&1 | tee "$log/torch" || torch_rc=${PIPESTATUS[0]}
    torch_result=$([[ $torch_rc -eq 0 ]] && tail -1 "$log/torch" || echo "FAILED (exit $torch_rc)")
    # What Checkpointer.step costs a GPU trainer's thread (issue 31 item 9):
    # the FSDP2 Llama of bench/torch/step_cost_bench.py on cuda:0.
    if python3 -c 'import torchdata.stateful_dataloader, transformers' 2>/dev/null; then
      echo "== step_cost_bench --device cuda"
      LD_LIBRARY_PATH="${cudart:+$cudart:}$LD_LIBRARY_PATH" PYTHONUNBUFFERED=1 ZCC_ZCCD="$PWD/$BUNDLE/bin/zccd" \
        PYTHONPATH="$PWD/$BUNDLE/python:$PWD/python/tests${PYTHONPATH:+:$PYTHONPATH}" python3 bench/torch/step_cost_bench.py \
        --device cuda 2>&1 | tee "$log/step_cost" || step_cost_rc=${PIPESTATUS[0]}
      step_cost_result=$([[ $step_cost_rc -eq 0 ]] && grep '^step_cost_bench:' "$log/step_cost" ||
        echo "FAILED (exit $step_cost_rc)")
    else
      step_cost_result="NOT RUN (torchdata or transformers missing for python3: carry their wheels)"
    fi
  fi
  local nccl_rc=0 nccl_result
  if ldd "$BUNDLE/bin/$NCCL_BINARY" 2>&1 | grep -q 'libnccl.*not found'; then
    nccl_result="NOT RUN (no libnccl.so.2 on this node: put its directory on LD_LIBRARY_PATH)"
  else
    echo "== $NCCL_BINARY (NcclCollective over every GPU of the node)"
    "$BUNDLE/bin/$NCCL_BINARY" --durations yes 2>&1 | tee "$log/nccl" || nccl_rc=${PIPESTATUS[0]}
    nccl_result=$([[ $nccl_rc -eq 0 ]] && echo PASSED || echo "FAILED (exit $nccl_rc)")
    grep -q "skipped: no CUDA device" "$log/nccl" && nccl_result+=" (device cases SKIPPED)"
    echo "== $NCCL_RESTORE (a C++ trainer's ranks restore together through NCCL)"
    local restore_rc=0
    "$BUNDLE/bin/$NCCL_RESTORE" --zccd "$PWD/$BUNDLE/bin/zccd" 2>&1 | tee "$log/nccl_restore" ||
      restore_rc=${PIPESTATUS[0]}
    [[ $restore_rc -eq 0 ]] || nccl_rc=$restore_rc
    nccl_result+="; $([[ $restore_rc -eq 0 ]] && tail -1 "$log/nccl_restore" || echo "$NCCL_RESTORE: FAILED (exit $restore_rc)")"
  fi
  echo "== summary"
  local skipped=""
  if grep -q "skipped: no CUDA device" "$log/test"; then
    skipped=" (the device cases SKIPPED: no CUDA device)"
  fi
  echo "cuda_copier_test: $([[ $test_rc -eq 0 ]] && echo PASSED || echo "FAILED (exit $test_rc)")$skipped"
  if [[ $bench_rc -ne 0 ]]; then
    echo "gpu_bench: FAILED (exit $bench_rc)"
  elif grep -q "skipped: no CUDA device" "$log/bench"; then
    echo "gpu_bench: SKIPPED (no CUDA device)"
  else
    echo "gpu_bench: OK (figures above)"
  fi
  local pull_skipped=""
  grep -q "skipped: no CUDA device" "$log/pull" && pull_skipped=" (SKIPPED: no CUDA device)"
  echo "daemon_pull_gpu_test: $([[ $pull_rc -eq 0 ]] && echo PASSED || echo "FAILED (exit $pull_rc)")$pull_skipped"
  if [[ $pull_bench_rc -ne 0 ]]; then
    echo "daemon_pull_bench: FAILED (exit $pull_bench_rc)"
  elif grep -q "skipped: no CUDA device" "$log/pull_bench"; then
    echo "daemon_pull_bench: SKIPPED (no CUDA device)"
  else
    echo "daemon_pull_bench: OK (figures above)"
  fi
  echo "$NCCL_BINARY: $nccl_result"
  echo "cuda_torch_check: $torch_result"
  echo "step_cost_bench: $step_cost_result"
  rm -rf "$log"
  [[ $test_rc -eq 0 && $bench_rc -eq 0 && $torch_rc -eq 0 && $nccl_rc -eq 0 && $pull_rc -eq 0 &&
    $pull_bench_rc -eq 0 && $step_cost_rc -eq 0 ]]
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  python-headers) shift; python_headers "$@" ;;
  *) usage ;;
esac
