#!/usr/bin/env bash
# A checkpoint written by a real zccd from real trainer processes loads with the
# `safetensors` Python package alone and holds exactly the trainers' bytes.
set -euo pipefail
ws="$TEST_SRCDIR/zcc"
zccd="$ws/daemon/zccd"
trainer="$ws/tests/test_trainer"
check="$ws/tests/interop_check.py"

python=""
for p in "${ZCC_PYTHON:-}" /root/.pyenv/versions/*/bin/python3 "$(command -v python3 || true)" /usr/bin/python3; do
  if [[ -n $p && -x $p ]] && "$p" -c "import safetensors, numpy" 2>/dev/null; then python=$p; break; fi
done
[[ -n $python ]] || { echo "FAIL: no python3 can import safetensors and numpy (tools/setup.sh installs them)"; exit 1; }

dir=$(mktemp -d /tmp/zcc-interop.XXXXXX)
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$zccd" --socket="$dir/zccd.sock" --root="$dir/ckpt" --shm_prefix="zccinterop$$" >"$dir/zccd.log" 2>&1 &
pid=$!
for _ in $(seq 1 400); do [[ -S $dir/zccd.sock ]] && break; sleep 0.05; done
common=(--socket="$dir/zccd.sock" --root="$dir/ckpt" --world=2 --steps=5 --save_every=5 --kib=4 --tensors=3 --block)
"$trainer" "${common[@]}" --rank=0 >"$dir/t0.log" 2>&1 &
t0=$!
"$trainer" "${common[@]}" --rank=1 >"$dir/t1.log" 2>&1
wait $t0 || { cat "$dir/t0.log" "$dir/zccd.log"; exit 1; }
"$python" "$check" "$dir/ckpt/itest/step-00000005" 2 5
