#!/usr/bin/env bash
# The zcc demo: sets up the machine, builds optimised binaries, starts zccd,
# runs a synthetic trainer that snapshots every step and checkpoints every K
# steps, restores the newest checkpoint into fresh buffers and checks it bit
# for bit, verifies the checkpoint offline with zccctl, and stops zccd.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=30
size_mb=1024
root=""
save_every=10
step_ms=300
tensors=150
ema_decay=0.999
slots=3

usage() {
  cat <<USAGE
usage: tools/demo.sh [--steps N] [--size-mb MB] [--root DIR] [--save-every K] [--step-ms MS]
                     [--tensors N] [--ema-decay D] [--slots N]

  --steps N        training steps (default $steps)
  --size-mb MB     model + optimizer state in MiB (default $size_mb: bf16 params,
                   fp32 master weights and Adam moments)
  --root DIR       checkpoint root (default: \$TMPDIR/zcc-demo/checkpoints)
  --save-every K   checkpoint every K steps (default $save_every)
  --step-ms MS     simulated accelerator time per step (default $step_ms)
  --tensors N      number of tensors (default $tensors)
  --ema-decay D    EMA decay zccd keeps for the parameters (default $ema_decay; 0 = off)
  --slots N        staging slots per rank, 2..8 (default $slots; with 3, snapshots and
                   the EMA go on while a checkpoint is written)
  --help           this text
USAGE
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --size-mb) size_mb=$2; shift 2 ;;
    --root) root=$2; shift 2 ;;
    --save-every) save_every=$2; shift 2 ;;
    --step-ms) step_ms=$2; shift 2 ;;
    --tensors) tensors=$2; shift 2 ;;
    --ema-decay) ema_decay=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
for v in "$steps" "$size_mb" "$save_every" "$step_ms" "$tensors" "$slots"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "demo: numeric options take whole numbers, got '$v'" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/zcc-demo.XXXXXX")
if [[ -z $root ]]; then
  root="${TMPDIR:-/tmp}/zcc-demo/checkpoints"
  # The demo's own root: the previous run's checkpoints of job "demo" go, so
  # this run's commits and restore check are its own (and the disk does not fill).
  rm -rf "$root/demo"
fi
mkdir -p "$root"
root=$(cd "$root" && pwd)

echo "== setup"
bash tools/setup.sh
source tools/bazel_flags.sh
echo "== build (optimised)"
bazel build "${ZCC_BAZEL_FLAGS[@]}" --config=opt //daemon:zccd //tools:demo_trainer //tools:zccctl
bin=$(bazel info "${ZCC_BAZEL_FLAGS[@]}" --config=opt bazel-bin 2>/dev/null)
cp "$bin/daemon/zccd" "$bin/tools/demo_trainer" "$bin/tools/zccctl" "$work/"

socket="$work/zccd.sock"
echo "== starting zccd (socket $socket, checkpoint root $root)"
"$work/zccd" --socket="$socket" --root="$root" --shm_prefix="zccdemo$$" --keep_last=3 --slots="$slots" \
  >"$work/zccd.log" 2>&1 &
zccd_pid=$!
cleanup() {
  if kill -0 "$zccd_pid" 2>/dev/null; then
    kill -TERM "$zccd_pid"
    wait "$zccd_pid" || true
  fi
}
trap cleanup EXIT
for _ in $(seq 1 200); do
  [[ -S $socket ]] && break
  kill -0 "$zccd_pid" 2>/dev/null || { cat "$work/zccd.log"; echo "demo: zccd failed to start" >&2; exit 1; }
  sleep 0.05
done

echo "== training"
"$work/demo_trainer" --socket="$socket" --root="$root" --job=demo --steps="$steps" \
  --save_every="$save_every" --size_mb="$size_mb" --step_ms="$step_ms" --tensors="$tensors" \
  --ema_decay="$ema_decay"

echo "== zccctl list demo"
"$work/zccctl" --socket "$socket" list demo --root "$root"
latest=$(cat "$root/demo/latest")
echo "== zccctl verify $root/demo/$latest"
"$work/zccctl" verify "$root/demo/$latest"

echo "== zccd checkpoint log"
grep -E "checkpoint job=|error|E " "$work/zccd.log" || true
cleanup
trap - EXIT
echo "== zccd stopped; shared memory left behind: $(ls /dev/shm | grep -c "^zccdemo$$" || true) segment(s)"
rm -rf "$work"
echo "demo: OK"
