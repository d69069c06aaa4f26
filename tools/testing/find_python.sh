# Sourced by the shell tests that run a Python checker: sets $python to the
# first interpreter that can `import safetensors, numpy`, or fails the test
# (rather than skipping it): tools/setup.sh installs them for /usr/bin/python3.
#
#   source "$runfiles/tools/testing/find_python.sh"
#
# Order: $ZCC_PYTHON, /usr/bin/python3 (safetensors next to Debian's torch),
# pyenv versions, then python3 on PATH (Bazel's strict action env hides the
# pyenv shims, so the usual places are searched).
candidates=()
[[ -n "${ZCC_PYTHON:-}" ]] && candidates+=("$ZCC_PYTHON")
candidates+=(/usr/bin/python3)
for p in /root/.pyenv/versions/*/bin/python3; do
  [[ -x "$p" ]] && candidates+=("$p")
done
if command -v python3 >/dev/null 2>&1; then candidates+=("$(command -v python3)"); fi
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
