#!/usr/bin/env bash
# Run inside the minimal root file system by tools/wheel/portable_test.sh:
# a fresh venv of CPython $1 installs zcc's wheel $2 with --no-index, the
# PyTorch stack $3 (a site-packages folder) on its path through a .pth file,
# so pip must find every requirement of zcc[torch] there; then the installed
# zccd serves the README's three lines (train_loop.py: 6 steps, then resumed
# to 9), `zccctl verify` checks the committed step, and client_test.py runs.
# Prints "RESULT ..." lines for the summary.
set -euo pipefail
python=$1 wheel=$2 stack=$3
here=$(cd "$(dirname "$0")" && pwd)
venv=$here/venv$("$python" -c 'import sys; print("%d%d" % sys.version_info[:2])')
run=$(mktemp -d /tmp/zccroot.XXXXXX)
zccd_pid=""
cleanup() {
  [[ -n $zccd_pid ]] && kill -TERM "$zccd_pid" 2>/dev/null && wait "$zccd_pid" || true
}
trap cleanup EXIT

"$python" -m venv --clear --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$stack" >"$site/zcc-test-torch.pth"
"$venv/bin/python" -m pip install -q --no-index --no-cache-dir "$wheel[torch]"
echo "RESULT $("$venv/bin/python" -V) in a fresh venv, pip install --no-index $(basename "$wheel")[torch]"

# Every library the wheel's ELF files load is found, and is the wheel's own
# copy (zcc.libs) unless the manylinux policy lets a wheel take it from the
# system (the C and C++ runtimes, zlib).
bad=""
for f in "$site"/zcc/_zcc.so "$site"/zcc/bin/*; do
  while read -r lib _ path _; do
    [[ -n $path ]] || continue
    if [[ $path == not ]]; then
      bad+="$(basename "$f"): $lib not found; "
    elif [[ $(realpath "$path") != "$site"/zcc.libs/* ]] &&
         ! [[ $lib =~ ^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libz|libresolv)\.so ]]; then
      bad+="$(basename "$f"): $lib from $path; "
    fi
  done < <(ldd "$f" | grep "=>")
done
[[ -z $bad ]] || { echo "libraries: $bad"; exit 1; }
echo "RESULT every library of _zcc.so, zccd and zccctl resolves to zcc.libs or the C/C++ runtimes"

socket=$run/zccd.sock
"$venv/bin/zccd" --socket="$socket" --root="$run/ckpt" --shm_prefix="zccroot$$" >"$run/zccd.log" 2>&1 &
zccd_pid=$!
for _ in $(seq 300); do
  [[ -S $socket ]] && break
  kill -0 "$zccd_pid" 2>/dev/null || { cat "$run/zccd.log"; exit 1; }
  sleep 0.05
done
[[ -S $socket ]] || { echo "zccd made no socket"; cat "$run/zccd.log"; exit 1; }

cd "$run"
value() { sed -n "s/^$1=//p" <<<"$2" | tail -1; }
first=$("$venv/bin/python" "$here/train_loop.py" --socket "$socket" --root "$run/ckpt" --job root \
  --steps 6 --save-every 3)
echo "$first"
second=$("$venv/bin/python" "$here/train_loop.py" --socket "$socket" --root "$run/ckpt" --job root \
  --steps 9 --save-every 3)
echo "$second"
[[ $(value restored "$first") == None && $(value committed "$first") == 6 ]] ||
  { echo "the first run did not start fresh and commit step 6"; exit 1; }
[[ $(value restored "$second") == 6 && $(value committed "$second") == 9 ]] ||
  { echo "the second run did not resume from step 6 and commit step 9"; exit 1; }
[[ $(value params_at_restore "$second") == $(value params "$first") ]] ||
  { echo "the restored parameters differ from those the first run ended with"; exit 1; }
"$venv/bin/zccctl" verify "$run/ckpt/root/step-00000009"
echo "RESULT README's three lines: steps 1-6, resumed at 6 with equal parameters, 7-9; zccctl verify step 9"

kill -TERM "$zccd_pid"
wait "$zccd_pid"
zccd_pid=""

tests=$(cd "$here" && ZCCD="$venv/bin/zccd" PYTHONPATH="$here" "$venv/bin/python" -u client_test.py 2>&1) ||
  { echo "$tests"; exit 1; }
echo "RESULT client_test.py: $(tail -1 <<<"$tests")"
