#!/usr/bin/env bash
# Starts a zccd for the examples in the foreground, with everything under one
# directory (default /tmp/zcc-example):
#   <dir>/zccd.sock   the socket (train_mlp.py --socket, or $ZCC_SOCKET)
#   <dir>/ckpt        the checkpoint root (train_mlp.py --root, or $ZCC_ROOT)
# Extra arguments go to zccd (zccd --help lists them). Stop it with Ctrl-C or
# SIGTERM: it finishes in-flight writes first.
#
#   examples/start_zccd.sh [DIR] [zccd flags...]
set -euo pipefail
dir="${1:-/tmp/zcc-example}"
[[ $# -gt 0 ]] && shift

zccd="${ZCCD:-}"
if [[ -z $zccd ]]; then
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  for candidate in "${RUNFILES_DIR:-$0.runfiles}/zcc/daemon/zccd" "$here/../daemon/zccd" \
                   "$here/../bazel-bin/daemon/zccd"; do
    if [[ -x $candidate ]]; then zccd=$candidate; break; fi
  done
fi
[[ -n $zccd ]] || { echo "start_zccd.sh: build //daemon:zccd first (or set ZCCD)" >&2; exit 1; }

mkdir -p "$dir/ckpt"
echo "zccd: socket $dir/zccd.sock, checkpoints in $dir/ckpt" >&2
exec "$zccd" --socket="$dir/zccd.sock" --root="$dir/ckpt" --allowed_roots="$dir/ckpt" \
  --shm_prefix="zccex$(id -u)" "$@"
