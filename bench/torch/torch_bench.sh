#!/usr/bin/env bash
# Runs bench/torch/torch_bench.py (zcc.torch against torch.distributed.checkpoint
# and torch.save/torch.load; see its docstring), or step_cost_bench.py for the
# target of that name, with PyTorch 2.x and the built zcc package from this
# target's runfiles:
#
#   bazel run --config=opt //bench/torch:torch_bench -- [--quick] [--only=PATTERN]
#
# bench/run.sh runs it with the other benchmarks (ZCC_BENCH_DIR, ZCC_ZCCD set).
#
# The interpreter: $ZCC_TORCH_PYTHON when set (it needs torch >= 2 and numpy),
# else the PyTorch 2.x environment tools/setup.sh makes ($ZCC_VENV, default
# ~/.cache/zcc/venv; Debian's python3.11, which _zcc.so is built for).
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/zcc"

python="${ZCC_TORCH_PYTHON:-${ZCC_VENV:-$HOME/.cache/zcc/venv}/bin/python}"
if ! "$python" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  echo "torch_bench: $python has no PyTorch 2.x (run tools/setup.sh, or set ZCC_TORCH_PYTHON)" >&2
  exit 1
fi
export PYTHONPATH="$runfiles/python:$runfiles/python/tests"
export ZCC_ZCCD="${ZCC_ZCCD:-$runfiles/daemon/zccd}"
export PYTHONDONTWRITEBYTECODE=1
# The script of the target's name: torch_bench.py, step_cost_bench.py.
script="$(basename "$0").py"
exec "$python" -u "$runfiles/bench/torch/$script" "$@"
