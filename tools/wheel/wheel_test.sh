#!/usr/bin/env bash
# zcc's wheel (//tools/wheel) installed with pip into a fresh virtual
# environment made from Debian's /usr/bin/python3, and used from outside the
# source tree: `import zcc, zcc.torch`, the zccd and zccctl commands, the
# shared libraries of its ELF files (runtime_packages.txt), and a training loop
# (train_loop.py) that checkpoints through the installed zccd, is run again and
# resumes from the committed step, whose checkpoint `zccctl verify` passes.
#
# PyTorch: by default pip installs zcc[torch] and its dependencies from PyPI,
# pinned by tools/requirements-torch.txt, as a user would (about a minute:
# PyPI's torch brings the CUDA libraries). Offline, ZCC_WHEEL_TEST_PYPI=0
# (bazel test --test_env=ZCC_WHEEL_TEST_PYPI=0) makes the venv reuse the
# pinned stack tools/setup.sh installed ($ZCC_TORCH_PYTHON's site-packages,
# through a .pth file) and installs the wheel with --no-index: every
# requirement of zcc[torch] must then already be met.
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-zcc}"
here="$runfiles/tools/wheel"
source "$runfiles/tools/python_env.sh"
unset PYTHONPATH

fail() { echo "FAIL: $*" >&2; exit 1; }
micros() { echo "${EPOCHREALTIME/./}"; }
seconds() { printf '%d.%02d' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }
start=$(micros)
phase_start=$start
phase() {  # prints the time the phase that just ended took
  local now
  now=$(micros)
  printf '[%6s s] %s\n' "$(seconds $((now - phase_start)))" "$1"
  phase_start=$now
}

wheels=("$here"/wheel/zcc-*.whl)
[[ ${#wheels[@]} -eq 1 && -f ${wheels[0]} ]] || fail "expected one wheel in $here/wheel: ${wheels[*]}"
wheel=${wheels[0]}
echo "wheel: $(basename "$wheel") ($(stat -L -c %s "$wheel") bytes)"

# The socket path must stay short (unix sockets: 108 bytes), so zccd's files
# go under /tmp; the venv under the test's own directory.
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
run=$(mktemp -d /tmp/zccwheel.XXXXXX)
zccd_pid=""
cleanup() {
  if [[ -n $zccd_pid ]] && kill -0 "$zccd_pid" 2>/dev/null; then
    kill -TERM "$zccd_pid"
    wait "$zccd_pid" || true
  fi
  rm -rf "$run"
}
trap cleanup EXIT

venv="$tmp/venv"
rm -rf "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [[ ${ZCC_WHEEL_TEST_PYPI:-1} == 1 ]]; then
  /usr/bin/python3 -m venv "$venv"
  pip=("$venv/bin/pip")
  phase "fresh venv $venv"
  "${pip[@]}" install -q "$wheel[torch]" -c "$runfiles/tools/requirements-torch.txt"
  phase "pip install zcc[torch] from the wheel, dependencies from PyPI"
else
  torch_site=$("$ZCC_TORCH_PYTHON" -c 'import os, sys, torch
assert sys.version_info[:2] == (3, 11), sys.version
print(os.path.dirname(os.path.dirname(torch.__file__)))') ||
    fail "$ZCC_TORCH_PYTHON has no torch for Python 3.11: run tools/setup.sh (or set ZCC_TORCH_PYTHON)"
  [[ -e $torch_site/zcc ]] && fail "$torch_site holds a zcc package: it would hide the installed one"
  # No pip or setuptools of its own (ensurepip's setuptools 66 would shadow
  # the newer one torch requires): the stack's pip installs into it.
  /usr/bin/python3 -m venv --without-pip "$venv"
  "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$tmp/site"
  echo "$torch_site" >"$(cat "$tmp/site")/zcc-test-torch.pth"
  pip=("$ZCC_TORCH_PYTHON" -m pip --python "$venv/bin/python")
  phase "fresh venv $venv, with $torch_site on its path"
  "${pip[@]}" install -q --no-index --no-cache-dir "$wheel[torch]"
  phase "pip install --no-index zcc[torch] from the wheel"
fi
py="$venv/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"${pip[@]}" check
# tools/sanitize.sh runs every test in an instrumented build: such a _zcc.so
# cannot be imported by the plain interpreter, and the wheel is not shipped.
if grep -qE 'lib(asan|tsan)' <<<"$(ldd "$site/zcc/_zcc.so" 2>/dev/null || true)"; then
  echo "SKIP: a sanitizer build (its _zcc.so links the runtime); the wheel is checked in plain builds"
  exit 0
fi
requires=$("$py" -c 'import importlib.metadata as m; print("\n".join(sorted(m.requires("zcc"))))')
want='accelerate>=1.15; extra == "accelerate"
lightning>=2.6; extra == "lightning"
numpy
paddleformers>=1.2; extra == "paddleformers"
paddlepaddle>=3.0; extra == "paddle"
paddlepaddle>=3.0; extra == "paddleformers"
safetensors
torch>=2.6; extra == "accelerate"
torch>=2.6; extra == "hf"
torch>=2.6; extra == "lightning"
torch>=2.6; extra == "torch"
transformers>=5.23; extra == "hf"'
[[ $requires == "$want" ]] || fail "zcc's requirements are: $requires"
[[ -x $venv/bin/zccd && -x $venv/bin/zccctl ]] || fail "pip made no zccd/zccctl in $venv/bin"
# Only the CUDA copier's module may need the CUDA runtime: `import zcc` must
# work on machines without it.
if readelf -d --wide "$site/zcc/_zcc.so" | grep -q 'libcudart'; then
  fail "_zcc.so needs libcudart; only _zcc_cuda.so (loaded by zcc.cuda_copier()) may"
fi
phase "pip check; requirements $requires"

# From an empty directory, so that nothing but the installed package is importable.
work="$run/work"
mkdir "$work"
cp "$here/train_loop.py" "$work/"
cd "$work"
package=$("$py" -c 'import os, zcc, zcc.torch; print(os.path.dirname(zcc.__file__))')
[[ $package == "$site/zcc" ]] || fail "zcc was imported from $package, not from $site/zcc"
"$py" -c 'import sys; sys.modules["torch"] = None; import zcc' || fail "import zcc needs torch"
ls "$package" "$package/bin"
phase "import zcc, zcc.torch from $package (and zcc without torch)"

help=$("$venv/bin/zccd" --help 2>&1) || true  # Abseil's --help exits 1
grep -q -- "--shm_prefix" <<<"$help" || fail "zccd --help lists no flags:"$'\n'"$help"
"$venv/bin/zccctl" --help | grep -q "verify STEP " || fail "zccctl --help"
shopt -s nullglob
elf_files=("$package"/_zcc*.so "$package"/bin/*)
shopt -u nullglob
/usr/bin/python3 "$here/runtime_packages.py" --expect "$here/runtime_packages.txt" "${elf_files[@]}"
phase "zccd --help, zccctl --help; shared libraries of ${elf_files[*]##*/}"

socket="$run/zccd.sock"
root="$run/ckpt"
"$venv/bin/zccd" --socket="$socket" --root="$root" --shm_prefix="zccwheel$$" \
  >"$run/zccd.log" 2>&1 &
zccd_pid=$!
for _ in $(seq 300); do
  [[ -S $socket ]] && break
  kill -0 "$zccd_pid" 2>/dev/null || fail "zccd exited:"$'\n'"$(cat "$run/zccd.log")"
  sleep 0.05
done
[[ -S $socket ]] || fail "zccd made no socket in 15 s:"$'\n'"$(cat "$run/zccd.log")"
phase "zccd started (the installed command, pid $zccd_pid)"

train() {  # prints the run's output; fails with it
  local out
  out=$("$py" train_loop.py --socket "$socket" --root "$root" --job wheel "$@" 2>&1) ||
    fail "train_loop.py $* failed:"$'\n'"$out"$'\n'"zccd's log:"$'\n'"$(cat "$run/zccd.log")"
  echo "$out"
}
value() { sed -n "s/^$1=//p" <<<"$2" | tail -1; }
latest() { cat "$root/wheel/latest" 2>/dev/null || echo none; }

first=$(train --steps 6 --save-every 3)
echo "$first"
[[ $(value restored "$first") == None ]] || fail "the first run restored something"
[[ $(value committed "$first") == 6 ]] || fail "the first run did not commit step 6"
[[ $(latest) == step-00000006 ]] || fail "latest is $(latest), not step-00000006"
phase "first run: steps 1..6, step 6 committed ($root/wheel/latest)"

second=$(train --steps 9 --save-every 3)
echo "$second"
[[ $(value restored "$second") == 6 ]] || fail "the second run did not resume from step 6"
[[ $(value params_at_restore "$second") == $(value params "$first") ]] ||
  fail "the restored parameters differ from those the first run ended with"
[[ $(value committed "$second") == 9 ]] || fail "the second run did not commit step 9"
[[ $(latest) == step-00000009 ]] || fail "latest is $(latest), not step-00000009"
phase "second run: resumed from step 6 with its parameters, steps 7..9, step 9 committed"

"$venv/bin/zccctl" verify "$root/wheel/step-00000009"
"$venv/bin/zccctl" --socket "$socket" list wheel
phase "zccctl verify, zccctl list"

kill -TERM "$zccd_pid"
code=0
wait "$zccd_pid" || code=$?
zccd_pid=""
[[ $code == 0 ]] || fail "zccd exited with $code after SIGTERM:"$'\n'"$(cat "$run/zccd.log")"
phase "zccd stopped"
echo "PASS: wheel_test in $(seconds $(($(micros) - start))) s"
