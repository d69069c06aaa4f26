#!/usr/bin/env bash
# Installs everything zcc needs to build and test on a fresh Debian 12 machine.
# Idempotent: packages already present are not reinstalled, and apt's index is
# refreshed only when something is missing. apt-get and pip only.
set -euo pipefail

APT_PACKAGES=(
  bazel-bootstrap            # Bazel 4.2.3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  catch2
  libboost-dev
  liburing-dev
  libxxhash-dev
  libsystemd-dev
  systemd                    # systemd-analyze verifies deploy/zccd.service
  python3-yaml               # the Kubernetes manifest check
  nlohmann-json3-dev
  pkg-config
  pybind11-dev python3-dev   # the zcc Python module (python/zcc), for /usr/bin/python3 (3.11)
  python3-venv               # the PyTorch 2.x environment below; the wheel test's fresh venv
  binutils                   # readelf: the wheel's shared libraries (tools/wheel/runtime_packages.py)
  python3-numpy              # the safetensors format checks (tools/testing/find_python.sh)
  python3-pip                # pip for /usr/bin/python3 (safetensors, below)
  clang libclang-rt-14-dev   # libFuzzer and sanitizer runtimes for fuzz/
)
PIP_PACKAGES=(safetensors numpy)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The format checks run Debian's /usr/bin/python3 with safetensors, which is
# not packaged: pip installs it for that interpreter (externally managed, hence
# --break-system-packages).
if [[ -x /usr/bin/python3 ]] && ! /usr/bin/python3 -c "import safetensors" 2>/dev/null; then
  echo "setup: pip installing safetensors for /usr/bin/python3"
  /usr/bin/python3 -m pip install -q --break-system-packages safetensors
fi

PY=${PYTHON:-python3}
need_pip=()
for p in "${PIP_PACKAGES[@]}"; do
  "$PY" -c "import $p" 2>/dev/null || need_pip+=("$p")
done
if ((${#need_pip[@]})); then
  echo "setup: pip installing ${need_pip[*]}"
  "$PY" -m pip install -q "${need_pip[@]}"
fi

# The Python tests, examples and benchmarks run on PyTorch 2.x from PyPI, in
# the virtual environment $ZCC_VENV (tools/python_env.sh) made from Debian's
# /usr/bin/python3 with exactly tools/requirements-torch.txt. The copy of the
# requirements written last marks it complete: a venv without it (pip failed
# half way) or with other pins is made again.
source "$(dirname "$0")/python_env.sh"
requirements="$(dirname "$0")/requirements-torch.txt"
if ! cmp -s "$requirements" "$ZCC_VENV/zcc-requirements.txt"; then
  echo "setup: making $ZCC_VENV (PyTorch 2.x from PyPI; $(grep -c '==' "$requirements") pinned packages, about 1 min)"
  rm -rf "$ZCC_VENV"
  mkdir -p "$(dirname "$ZCC_VENV")"
  /usr/bin/python3 -m venv "$ZCC_VENV"
  if ! "$ZCC_VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"; then
    echo "setup: pip could not install $requirements into $ZCC_VENV" >&2
    exit 1
  fi
  cp "$requirements" "$ZCC_VENV/zcc-requirements.txt"
fi
