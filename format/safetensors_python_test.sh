#!/bin/bash
# Writes a sample file with write_sample_safetensors and reads it back with the
# reference `safetensors` Python package (see safetensors_python_test.py).
# Fails, rather than skips, when no Python can import safetensors and numpy:
# tools/setup.sh installs them.
set -euo pipefail

runfiles="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-zcc}"
writer="$runfiles/format/write_sample_safetensors"
checker="$runfiles/format/safetensors_python_test.py"
out_dir="${TEST_TMPDIR:-$(mktemp -d)}"

# Bazel's strict action env hides the pyenv shims, so look in the usual places.
candidates=()
[[ -n "${ZCC_PYTHON:-}" ]] && candidates+=("$ZCC_PYTHON")
for p in /root/.pyenv/versions/*/bin/python3; do
  [[ -x "$p" ]] && candidates+=("$p")
done
if command -v python3 >/dev/null 2>&1; then candidates+=("$(command -v python3)"); fi
candidates+=(/usr/bin/python3)

python=""
for p in "${candidates[@]}"; do
  if [[ -x "$p" ]] && "$p" -c "import safetensors, numpy" >/dev/null 2>&1; then
    python="$p"
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "FAIL: no python3 that can 'import safetensors, numpy' among: ${candidates[*]}" >&2
  echo "Run tools/setup.sh, or set ZCC_PYTHON (bazel test --test_env=ZCC_PYTHON=...)." >&2
  exit 1
fi
echo "using $python"

"$writer" "$out_dir/sample.safetensors"
"$python" "$checker" "$out_dir/sample.safetensors"
