#!/usr/bin/env bash
# Runs a Python test (first argument: its workspace-relative path) with
# PyTorch 2.x: $ZCC_TORCH_PYTHON when set, else the virtual environment
# tools/setup.sh makes ($ZCC_VENV, default ~/.cache/zcc/venv; Debian's
# python3.11, the interpreter _zcc.so is built for, with the pins of
# tools/requirements-torch.txt). The built package comes from the runfiles:
# PYTHONPATH gets python/ (zcc/ with _zcc.so), python/tests/ (zccd_process)
# and examples/; $ZCCD is the built //daemon:zccd.
# With --paddle first: Paddle instead, $ZCC_PADDLE_VENV (default
# ~/.cache/zcc/paddle-venv, tools/requirements-paddle.txt); with
# --paddleformers, PaddleFormers' stack, $ZCC_PADDLEFORMERS_VENV (default
# ~/.cache/zcc/paddleformers-venv, tools/requirements-paddleformers.txt).
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-zcc}"
if [[ ${1:-} == --paddle || ${1:-} == --paddleformers ]]; then
  if [[ $1 == --paddle ]]; then
    python="${ZCC_PADDLE_VENV:-$HOME/.cache/zcc/paddle-venv}/bin/python"
    framework=paddle
    what="(run tools/setup.sh, or set ZCC_PADDLE_VENV)"
  else
    python="${ZCC_PADDLEFORMERS_VENV:-$HOME/.cache/zcc/paddleformers-venv}/bin/python"
    framework=paddleformers
    what="(run tools/setup.sh, or set ZCC_PADDLEFORMERS_VENV)"
  fi
  shift
  # With $TEST_TMPDIR in its environment (Bazel sets it), PaddlePaddle 3.3
  # aborts at exit with a double free in an exit handler, and its SIGABRT
  # handler then deadlocks in malloc: even `python -c "import paddle"` never
  # exits (reproduced outside Bazel with that variable alone). Paddle's tests
  # run without it (zcc's tests keep their files under /tmp).
  unset TEST_TMPDIR
else
  python="${ZCC_TORCH_PYTHON:-${ZCC_VENV:-$HOME/.cache/zcc/venv}/bin/python}"
  framework=torch
  what="(run tools/setup.sh, or set ZCC_TORCH_PYTHON)"
fi

if ! "$python" -c "import $framework, numpy, safetensors" >/dev/null 2>&1; then
  echo "FAIL: $python cannot import $framework, numpy and safetensors $what" >&2
  exit 1
fi

# A sanitizer build (.bazelrc --config=asan/tsan) instruments _zcc.so but not
# the interpreter: the runtime must be loaded first, and CPython's own
# allocations are not leaks to report.
# libstdc++ is preloaded with it: the runtime's interceptors for C++ (operator
# new, __cxa_throw) must resolve to a libstdc++ that is already there, not one
# torch dlopens later.
# (ldd's output is captured first: `ldd | grep -q` under pipefail fails at
# random when grep exits before ldd has written everything.)
deps=$(ldd "$runfiles/python/zcc/_zcc.so" 2>/dev/null || true)
if grep -q libasan <<<"$deps"; then
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
  export ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}"
elif grep -q libtsan <<<"$deps"; then
  export LD_PRELOAD="$(gcc -print-file-name=libtsan.so) $(gcc -print-file-name=libstdc++.so)"
fi

export PYTHONPATH="$runfiles/python:$runfiles/python/tests:$runfiles/examples"
export ZCCD="$runfiles/daemon/zccd"
export PYTHONDONTWRITEBYTECODE=1
echo "using $python ($("$python" -c "import sys, $framework; print(sys.version.split()[0], '$framework', $framework.__version__)" 2>/dev/null))"
script="$runfiles/$1"
shift
exec "$python" -u "$script" "$@"
