#!/usr/bin/env bash
# Runs examples/train_mlp.py with the built zcc package on PYTHONPATH (the
# target's runfiles) and the PyTorch 2.x environment tools/setup.sh makes
# ($ZCC_TORCH_PYTHON, else $ZCC_VENV/bin/python, default ~/.cache/zcc/venv).
#   bazel run //examples:train_mlp -- --socket /tmp/zcc-example/zccd.sock ...
# With --nproc N it runs N ranks under torchrun (torch.distributed.run).
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/zcc"
python="${ZCC_TORCH_PYTHON:-${ZCC_VENV:-$HOME/.cache/zcc/venv}/bin/python}"
export PYTHONPATH="$runfiles/python${PYTHONPATH:+:$PYTHONPATH}"
if [[ ${1:-} == --nproc ]]; then
  nproc=$2
  shift 2
  exec "$python" -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
    "$runfiles/examples/train_mlp.py" "$@"
fi
exec "$python" "$runfiles/examples/train_mlp.py" "$@"
