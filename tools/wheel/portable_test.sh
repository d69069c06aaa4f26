#!/usr/bin/env bash
# zcc's portable wheels, as users get them: built by tools/build_wheel.sh
# --all-pythons (one manylinux wheel per CPython 3.10-3.13), then
#   1. on this machine, for each CPython: a fresh venv installs its wheel
#      (numpy and safetensors from PyPI), and python/tests/client_test.py runs
#      from outside the source tree against the wheel's own zccd; every ELF
#      file of the installed wheel loads only libraries the wheel carries or
#      the manylinux policy allows;
#   2. in a minimal Debian 12 root file system (debootstrap --variant=minbase
#      with python3 and nothing else; none of the build's packages), entered
#      with chroot in a private mount namespace:
#        - Debian's python3 (3.11): a fresh venv installs the cp311 wheel and
#          trains with README's three lines (tools/wheel/train_loop.py)
#          against the wheel's zccd, resumes, and `zccctl verify` passes;
#        - CPython 3.12 (pyenv's, copied in): the same with the cp312 wheel, and
#          client_test.py.
#      PyTorch comes from PyPI through venvs made outside the root (the root
#      has no network): tools/setup.sh's for 3.11, and $ZCC_TORCH312_VENV
#      (default ~/.cache/zcc/torch312-venv, made here once with
#      tools/requirements-torch.txt) for 3.12; the root's venvs see them
#      through a .pth file and pip installs zcc with --no-index, so every
#      requirement of zcc[torch] must be met by what is there.
# The root file system is cached in ~/.cache/zcc/rootfs (made once, ~1 min).
# Prints "PASS: ..."/"FAIL: ..." per check and ends with "N passed, M failed".
# Needs root (debootstrap, chroot, mount), or sudo.
#
#   tools/wheel/portable_test.sh [--wheels DIR] [--no-root-fs]
#     --wheels DIR   test the wheels in DIR instead of building them
#     --no-root-fs   skip part 2 (said so in the summary; not a pass)
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
source tools/wheel/pythons.sh
source tools/python_env.sh
wheels_dir=""
root_fs=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --wheels) wheels_dir=$2; shift 2 ;;
    --no-root-fs) root_fs=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "portable_test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

passed=0
failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
summary() {
  ((root_fs)) || echo "portable_test: the root file system part was skipped (--no-root-fs)"
  echo "portable_test: $passed passed, $failed failed"
  exit $((failed > 0))
}
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH LD_LIBRARY_PATH

work=$(mktemp -d /tmp/zccportable.XXXXXX)
cleanup() { $SUDO rm -rf "$work"; }
trap cleanup EXIT

# ---------------------------------------------------------------- the wheels
if [[ -z $wheels_dir ]]; then
  wheels_dir=$work/dist
  echo "== building the wheels (tools/build_wheel.sh --all-pythons)"
  if ! bash tools/build_wheel.sh --all-pythons --out "$wheels_dir" 2>&1 | grep -E "^build_wheel|auditwheel: Fixed|ERROR"; then
    fail "tools/build_wheel.sh --all-pythons"
    summary
  fi
fi
declare -A wheel_for python_for
for version in "${ZCC_WHEEL_PYTHON_VERSIONS[@]}"; do
  tag="cp${version/./}"
  found=("$wheels_dir"/zcc-*-"$tag"-"$tag"-manylinux_*_x86_64.whl)
  py=$(zcc_find_python "$version") || py=""
  if [[ ! -f ${found[0]} || -z $py ]]; then
    fail "CPython $version: ${py:-no interpreter found}; wheel: ${found[*]}"
    continue
  fi
  wheel_for[$version]=${found[0]}
  python_for[$version]=$py
  # manylinux_2_NN: the glibc it needs. 2.34 is what Debian 12's build needs
  # (RHEL 9, Ubuntu 22.04 and newer); anything newer is a regression.
  glibc=$(basename "${found[0]}" | sed -E 's/.*manylinux_2_([0-9]+)_x86_64\.whl/\1/')
  if ! twine=$("${ZCC_WHEEL_VENV:-$HOME/.cache/zcc/wheel-venv}/bin/twine" check --strict "${found[0]}" 2>&1); then
    fail "CPython $version: twine check --strict $(basename "${found[0]}"): $twine"
  elif [[ $glibc -le 34 ]]; then
    pass "CPython $version: $(basename "${found[0]}") ($(du -h "${found[0]}" | cut -f1), glibc 2.$glibc, twine check passed)"
  else
    fail "CPython $version: $(basename "${found[0]}") needs glibc 2.$glibc (more than 2.34)"
  fi
done

# Every ELF file of an installed zcc ($1: its package folder) must load only
# libraries from the wheel (zcc.libs) or those the manylinux policy lets a
# wheel take from the system; libcudart only for the CUDA copier's module.
check_libraries() {
  local package=$1 f line bad=""
  for f in "$package"/_zcc*.so "$package"/bin/*; do
    while read -r line; do
      [[ $line == *"=>"* ]] || continue
      local lib=${line%% *} path
      path=$(awk '{print $3}' <<<"$line")
      if [[ $path == "not" ]]; then
        [[ $lib == libcudart.so.* && $f == */_zcc_cuda.so ]] && continue
        bad+="$(basename "$f"): $lib not found; "
      elif [[ $(realpath "$path") != "$(dirname "$package")"/zcc.libs/* ]] &&
           ! [[ $lib =~ ^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libz|libresolv|libutil|libcudart)\.so ]]; then
        bad+="$(basename "$f"): $lib from $path; "
      fi
    done < <(ldd "$f" 2>&1)
  done
  [[ -z $bad ]] || { echo "$bad"; return 1; }
}

# The tests that run from outside the source tree, against an installed zcc.
tests=$work/tests
mkdir -p "$tests"
cp python/tests/client_test.py python/tests/zcc_testing.py python/tests/zccd_process.py \
  tools/wheel/train_loop.py "$tests/"

# ------------------------------------------------- 1. a fresh venv per CPython
for version in "${ZCC_WHEEL_PYTHON_VERSIONS[@]}"; do
  [[ -n ${wheel_for[$version]:-} ]] || continue
  py=${python_for[$version]}
  venv=$work/venv$version
  log=$work/venv$version.log
  echo "== CPython $version ($py): fresh venv, pip install $(basename "${wheel_for[$version]}")"
  if ! { "$py" -m venv "$venv" && "$venv/bin/pip" install -q "${wheel_for[$version]}" &&
         "$venv/bin/pip" check; } >"$log" 2>&1; then
    fail "CPython $version: pip install of the wheel: $(tail -5 "$log")"
    continue
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if out=$(check_libraries "$site/zcc"); then
    pass "CPython $version: every ELF file loads only zcc.libs' and the system's C/C++ runtimes"
  else
    fail "CPython $version: shared libraries: $out"
  fi
  meta=$("$venv/bin/python" -c 'import importlib.metadata as m; d = m.metadata("zcc")
print(d["License"], d["Requires-Python"], m.version("zcc"))')
  [[ $meta == "Apache-2.0 >=3.10 "* ]] && pass "CPython $version: metadata $meta" ||
    fail "CPython $version: metadata $meta"
  if (cd "$tests" && ZCCD="$venv/bin/zccd" PYTHONPATH="$tests" timeout 600 \
        "$venv/bin/python" -u client_test.py) >"$log" 2>&1 &&
     grep -q "zcc imported from $site/zcc" <(cd "$tests" && "$venv/bin/python" -c \
        'import os, zcc; print("zcc imported from", os.path.dirname(zcc.__file__))'); then
    pass "CPython $version: client_test.py against the wheel's zccd ($(tail -1 "$log"))"
  else
    fail "CPython $version: client_test.py:"$'\n'"$(tail -30 "$log")"
  fi
done

if ((!root_fs)); then
  summary
fi

# --------------------------------------- 2. a root file system without them
rootfs_cache=${ZCC_ROOTFS_CACHE:-$HOME/.cache/zcc/rootfs}
rootfs_tar=$rootfs_cache/bookworm-minbase-python3.tar
if [[ ! -f $rootfs_tar ]]; then
  if ! command -v debootstrap >/dev/null; then
    fail "debootstrap is not installed (tools/setup.sh installs it)"
    summary
  fi
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "== debootstrap --variant=minbase --include=python3 bookworm ($mirror), once"
  mkdir -p "$rootfs_cache"
  if ! $SUDO debootstrap --variant=minbase --include=python3 bookworm "$work/make-root" "$mirror" \
       >"$work/debootstrap.log" 2>&1 ||
     ! $SUDO tar -C "$work/make-root" -cf "$rootfs_tar.part" . ; then
    fail "debootstrap: $(tail -5 "$work/debootstrap.log")"
    summary
  fi
  mv "$rootfs_tar.part" "$rootfs_tar"
  $SUDO rm -rf "$work/make-root"
fi
root=$work/root
mkdir "$root"
$SUDO tar -C "$root" -xf "$rootfs_tar"

# The root holds none of the build's libraries (libsystemd0 and libxxhash0 are
# apt's own and libssl3 python3's, in every Debian 12: the wheel loads its own
# copies; root_fs_check.sh checks where each library resolves).
present=$($SUDO chroot "$root" dpkg-query -W -f='${Package}\n' 2>/dev/null |
  grep -xE 'libgrpc.*|libprotobuf.*|libabsl.*|libcurl.*|liburing.*|libpugixml.*|libatomic1|python3-numpy' || true)
if [[ -z $present ]]; then
  pass "root file system: Debian 12 minbase + python3, without gRPC, Protobuf, Abseil, libcurl, liburing, pugixml, libatomic, NumPy"
else
  fail "root file system holds the build's packages: $present"
fi

# The PyTorch stacks the root's venvs borrow, and CPython 3.12 copied in.
torch311=$("$ZCC_TORCH_PYTHON" -c 'import os, sys, torch
assert sys.version_info[:2] == (3, 11), sys.version
print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || torch311=""
torch312_venv=${ZCC_TORCH312_VENV:-$HOME/.cache/zcc/torch312-venv}
if [[ -n ${python_for[3.12]:-} ]] && ! cmp -s tools/requirements-torch.txt "$torch312_venv/zcc-requirements.txt"; then
  echo "== making $torch312_venv (PyTorch for CPython 3.12 from PyPI, once; about a minute)"
  rm -rf "$torch312_venv"
  if "${python_for[3.12]}" -m venv "$torch312_venv" &&
     "$torch312_venv/bin/pip" install -q -r tools/requirements-torch.txt >"$work/torch312.log" 2>&1; then
    cp tools/requirements-torch.txt "$torch312_venv/zcc-requirements.txt"
  else
    fail "pip install -r tools/requirements-torch.txt for CPython 3.12: $(tail -5 "$work/torch312.log")"
  fi
fi
torch312=$("$torch312_venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || torch312=""

# Runs $2... inside the root, in a private mount namespace (its mounts vanish
# with it): /proc, a fresh /dev/shm, the host's /dev nodes, and the PyTorch
# stack $1 read-only at its own path.
in_root() {
  local stack=$1
  shift
  $SUDO unshare --mount --propagation private -- bash -c '
    set -e
    root=$1 stack=$2
    shift 2
    mount --bind /dev "$root/dev"
    mount -t tmpfs -o size=2g tmpfs "$root/dev/shm"
    mount -t proc proc "$root/proc"
    if [[ -n $stack ]]; then
      mkdir -p "$root$stack"
      mount --bind -o ro "$stack" "$root$stack"
    fi
    exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1 "$@"
  ' in_root "$root" "$stack" "$@"
}

# The three lines of README in the root: Python $1 (a path inside the root),
# its wheel $2, PyTorch stack $3 (a site-packages folder, borrowed).
root_train() {
  local version=$1 python=$2 wheel=$3 stack=$4
  local name="root file system, CPython $version"
  if [[ -z $stack ]]; then
    fail "$name: no PyTorch stack for CPython $version to borrow"
    return
  fi
  $SUDO mkdir -p "$root/zcc-test"
  $SUDO cp "$wheel" "$tests"/*.py tools/wheel/root_fs_check.sh "$root/zcc-test/"
  if in_root "$stack" bash /zcc-test/root_fs_check.sh "$python" "/zcc-test/$(basename "$wheel")" \
       "$stack" >"$work/root$version.log" 2>&1; then
    pass "$name: $(grep '^RESULT' "$work/root$version.log" | sed 's/^RESULT //' | paste -sd ';' -)"
  else
    fail "$name:"$'\n'"$(tail -40 "$work/root$version.log")"
  fi
}

if [[ -n ${wheel_for[3.11]:-} ]]; then
  root_train 3.11 /usr/bin/python3 "${wheel_for[3.11]}" "$torch311"
fi
if [[ -n ${wheel_for[3.12]:-} ]]; then
  # pyenv's CPython needs only libraries Debian's python3 already brought.
  prefix=$(dirname "$(dirname "${python_for[3.12]}")")
  $SUDO mkdir -p "$root$prefix"
  $SUDO cp -a "$prefix/." "$root$prefix/"
  root_train 3.12 "$prefix/bin/python3" "${wheel_for[3.12]}" "$torch312"
fi
summary
