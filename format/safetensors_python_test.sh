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

source "$runfiles/tools/testing/find_python.sh"

"$writer" "$out_dir/sample.safetensors"
"$python" "$checker" "$out_dir/sample.safetensors"
