#!/usr/bin/env bash
# Builds zcc's wheel, optimised (bazel --config=opt, //tools/wheel), into dist/
# (or --out DIR): zcc-<version>-cp311-cp311-linux_x86_64.whl with the zcc
# package (_zcc*.so, zcc.torch) and the zccd and zccctl programs, for Debian
# 12's python3.11 on x86-64. Install it into a virtual environment:
#   python3 -m venv venv && venv/bin/pip install dist/zcc-*.whl
# See README.md, "Install into your own environment", for the runtime packages.
#
#   tools/build_wheel.sh [--out DIR] [--nocuda]
#     --out DIR   where the wheel goes (default: dist/ in the repository); older
#                 zcc wheels there are removed, so that dist/zcc-*.whl is one file
#     --nocuda    build without nvcc even where it is installed: a wheel that does
#                 not need the CUDA runtime (libcudart) at run time
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/dist"
nocuda=0
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || { echo "build_wheel.sh: --out needs a folder" >&2; exit 2; }
           out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --nocuda) nocuda=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_wheel.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v bazel >/dev/null 2>&1; then
  echo "build_wheel.sh: bazel is not installed. tools/setup.sh installs it (Debian's" \
    "bazel-bootstrap, Bazel 4.2.3) with the rest of what the build needs." >&2
  exit 1
fi

cd "$repo"
source tools/bazel_flags.sh
flags=("${ZCC_BAZEL_FLAGS[@]}" --config=opt)
if ((nocuda)) && [[ " ${ZCC_BAZEL_FLAGS[*]} " != *" --config=nocuda "* ]]; then
  flags+=(--config=nocuda)
fi
bazel build "${flags[@]}" //tools/wheel
built="$(bazel info "${flags[@]}" bazel-bin 2>/dev/null)/tools/wheel/wheel"
wheels=("$built"/zcc-*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
  echo "build_wheel.sh: expected one wheel in $built, found: ${wheels[*]}" >&2
  exit 1
fi
wheel=${wheels[0]}

mkdir -p "$out"
for old in "$out"/zcc-*.whl; do
  if [[ -f $old && $(basename "$old") != $(basename "$wheel") ]]; then
    echo "build_wheel.sh: removing the older $old"
    rm -f "$old"
  fi
done
install -m 0644 "$wheel" "$out/"
echo "build_wheel.sh: $out/$(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# The shared libraries its ELF files load and the Debian packages they come from.
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
python3 -m zipfile -e "$wheel" "$unpacked"
chmod +x "$unpacked"/zcc/bin/*
echo "build_wheel.sh: run-time libraries (Debian package, libraries):"
python3 tools/wheel/runtime_packages.py --expect tools/wheel/runtime_packages.txt \
  "$unpacked"/zcc/_zcc*.so "$unpacked"/zcc/bin/* | sed 's/^/  /'
if [[ " ${flags[*]} " != *" --config=nocuda "* ]]; then
  echo "build_wheel.sh: built with CUDA (nvcc is installed): the wheel needs the CUDA" \
    "runtime (libcudart) where it runs; --nocuda builds one without"
fi
