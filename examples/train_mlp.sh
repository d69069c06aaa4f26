#!/usr/bin/env bash
# Runs examples/train_mlp.py with the built zcc package on PYTHONPATH (the
# target's runfiles) and Debian's /usr/bin/python3 (torch from apt).
#   bazel run //examples:train_mlp -- --socket /tmp/zcc-example/zccd.sock ...
# With --nproc N it runs N ranks under torchrun (torch.distributed.run).
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/zcc"
python="${ZCC_TORCH_PYTHON:-/usr/bin/python3}"
export PYTHONPATH="$runfiles/python${PYTHONPATH:+:$PYTHONPATH}"
if [[ ${1:-} == --nproc ]]; then
  nproc=$2
  shift 2
  # --redirects/--tee 1: with Python 3.11, torchrun 1.13's default "0" parses
  # to None (IntFlag iteration skips the zero member) and it crashes.
  exec "$python" -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
    --redirects 1 --tee 1 "$runfiles/examples/train_mlp.py" "$@"
fi
exec "$python" "$runfiles/examples/train_mlp.py" "$@"
