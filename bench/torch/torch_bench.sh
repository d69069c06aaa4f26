#!/usr/bin/env bash
# Runs bench/torch/torch_bench.py (zcc.torch against torch.distributed.checkpoint
# and torch.save/torch.load; see its docstring) with PyTorch 2.x and the built zcc
# package from this target's runfiles:
#
#   bazel run --config=opt //bench/torch:torch_bench -- [--quick] [--only=PATTERN]
#
# bench/run.sh runs it with the other benchmarks (ZCC_BENCH_DIR, ZCC_ZCCD set).
#
# The interpreter: $ZCC_TORCH_PYTHON when set (it needs torch >= 2 and numpy);
# else the virtual environment $ZCC_TORCH_VENV (default ~/.cache/zcc/torch2-venv),
# made when it does not exist: python3.11 -m venv, then pip install torch numpy
# from the configured index, with $ZCC_TORCH_PIP_ARGS added (e.g.
# "--index-url https://download.pytorch.org/whl/cpu" for the smaller CPU wheel).
# Python 3.11 because _zcc.so is built for Debian 12's python3.11.
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/zcc"

# Makes the venv, which does not exist yet; removes it again when pip fails.
make_venv() {
  local venv=$1
  echo "torch_bench: creating $venv with PyTorch 2.x (pip install torch numpy ${ZCC_TORCH_PIP_ARGS:-})" >&2
  python3.11 -m venv "$venv"
  # shellcheck disable=SC2086  # ZCC_TORCH_PIP_ARGS is a list of arguments
  if ! "$venv/bin/python" -m pip install --quiet ${ZCC_TORCH_PIP_ARGS:-} torch numpy >&2; then
    rm -rf "$venv"
    echo "torch_bench: pip could not install torch into $venv (set ZCC_TORCH_PYTHON, or" \
      "ZCC_TORCH_PIP_ARGS for another index)" >&2
    exit 1
  fi
}

if [[ -n ${ZCC_TORCH_PYTHON:-} ]]; then
  python=$ZCC_TORCH_PYTHON
else
  venv="${ZCC_TORCH_VENV:-$HOME/.cache/zcc/torch2-venv}"
  [[ -e $venv ]] || make_venv "$venv"
  python=$venv/bin/python
fi
if ! "$python" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  echo "torch_bench: $python has no PyTorch 2.x (set ZCC_TORCH_PYTHON to an interpreter that has" \
    "it${venv:+, or remove $venv to have it made again})" >&2
  exit 1
fi
export PYTHONPATH="$runfiles/python:$runfiles/python/tests"
export ZCC_ZCCD="${ZCC_ZCCD:-$runfiles/daemon/zccd}"
export PYTHONDONTWRITEBYTECODE=1
exec "$python" -u "$runfiles/bench/torch/torch_bench.py" "$@"
