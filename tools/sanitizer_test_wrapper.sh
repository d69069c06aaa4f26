#!/usr/bin/env bash
# Bazel --run_under wrapper used by tools/sanitize.sh: gives each test target
# its own sanitizer report directory under $ZCC_SANITIZER_REPORTS. Tests run
# in PID namespaces, so two tests' processes can share a pid, and with one
# directory for all their reports (log_path=DIR/tsan -> DIR/tsan.<pid>) one
# would overwrite the other's.
set -euo pipefail
dir=${ZCC_SANITIZER_REPORTS:?}/$(tr '/:' '__' <<<"${TEST_TARGET:-unknown}")
mkdir -p "$dir"
chmod 0777 "$dir"  # tests may run processes as other users
for var in ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
  name=$(tr 'A-Z' 'a-z' <<<"${var%_OPTIONS}")
  [[ -n ${!var:-} ]] && export "$var=${!var}:log_path=$dir/$name:log_exe_name=1"
done
exec "$@"
