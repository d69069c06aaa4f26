#!/usr/bin/env bash
# Runs the whole test suite under a sanitizer build and summarises what the
# sanitizers reported:
#
#   tools/sanitize.sh asan    # AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer)
#   tools/sanitize.sh tsan    # ThreadSanitizer (suppressions: tools/tsan.supp)
#   tools/sanitize.sh asan //format/... //tests:crash_test    # some targets only
#
# The build uses `--config=asan|tsan` from .bazelrc with an output base of its
# own (ZCC_SANITIZE_OUTPUT_BASE, default ~/.cache/zcc/bazel-<config>), so the
# normal build's cache is not evicted, and --symlink_prefix=/ so the bazel-*
# links in the workspace keep pointing at the normal build.
#
# Every process of a test (the test itself and the zccd, trainer and zccctl
# processes integration tests start) inherits the sanitizer options, so
# reports from child processes are collected too. Timeouts are raised for the slower instrumented code.
# Ends with a summary: tests passed/failed, and each distinct sanitizer report
# (first frame in zcc code) with how often it occurred. Exit status: 0 when
# every test passed and nothing was reported.
#
# Reports go to one directory per test target (tools/sanitizer_test_wrapper.sh
# runs each test), named <tool>.<executable>.<pid>.
#
# TSan and uninstrumented libraries: Debian's Abseil, gRPC, protobuf and
# PyTorch are not built with -fsanitize=thread. zcc's own locks are
# zcc::Mutex (common/mutex.h), which tells TSan what absl::Mutex does;
# tools/tsan.supp suppresses reports inside those libraries only, never in
# zcc's code.
set -uo pipefail
cd "$(dirname "$0")/.."

config=${1:-}
case $config in
  asan|tsan) shift ;;
  *) echo "usage: tools/sanitize.sh asan|tsan [TARGETS...]" >&2; exit 2 ;;
esac
targets=("$@")
if ((${#targets[@]} == 0)); then
  # Everything: //... spelled out per top-level folder, because with
  # --symlink_prefix=/ Bazel no longer recognises the normal build's bazel-*
  # links as its own and would descend into them.
  targets=(//:all)
  for d in */; do
    d=${d%/}
    [[ -L $d ]] && continue
    [[ -n $(find "$d" \( -name BUILD -o -name BUILD.bazel \) -print -quit) ]] && targets+=("//$d/...")
  done
fi

bash tools/setup.sh >/dev/null || { echo "setup failed"; exit 1; }
source tools/bazel_flags.sh

output_base=${ZCC_SANITIZE_OUTPUT_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/zcc/bazel-$config}
reports=$(mktemp -d "/tmp/zcc-$config-reports.XXXXXX")
chmod 0777 "$reports"  # tests may run processes as other users

case $config in
  asan)
    # As in .bazelrc (see there); the wrapper adds log_path.
    env_flags=(
      "--test_env=ASAN_OPTIONS=abort_on_error=1:check_initialization_order=1:strict_init_order=1"
      "--test_env=UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
      "--test_env=LSAN_OPTIONS=report_objects=0"
    )
    ;;
  tsan)
    # The crash matrix runs 5-15x slower under TSan: fewer trials keep it
    # inside its timeout.
    env_flags=(
      "--test_env=TSAN_OPTIONS=suppressions=$PWD/tools/tsan.supp:halt_on_error=0:second_deadlock_stack=1:history_size=4"
      --test_env=ZCC_CRASH_TRIALS=8 --test_env=ZCC_CRASH_TRAINER_TRIALS=2
    )
    ;;
esac

bazel=(bazel --output_base="$output_base")
flags=("${ZCC_BAZEL_FLAGS[@]}" --config="$config" --symlink_prefix=/ --keep_going
       --test_output=errors --test_timeout=300,900,1800,3600 "${env_flags[@]}"
       --run_under="$PWD/tools/sanitizer_test_wrapper.sh" "--test_env=ZCC_SANITIZER_REPORTS=$reports")

start=$(date +%s)
log=$reports/bazel.log
"${bazel[@]}" test "${flags[@]}" -- "${targets[@]}" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

echo
echo "=== tools/sanitize.sh $config summary ($(( $(date +%s) - start ))s, output base $output_base)"
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed_lines=$(grep -E '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log" || true)
failed=$(grep -c . <<<"$failed_lines")
[[ -z $failed_lines ]] && failed=0
echo "tests: $passed passed, $failed not passed"
[[ -n $failed_lines ]] && sed 's/^/  /' <<<"$failed_lines"
if grep -q "FAILED: Build did NOT complete" "$log"; then
  echo "build: FAILED (see $log)"
fi

# Distinct reports: the report's headline plus its first stack frame inside
# this workspace (or the first frame at all).
mapfile -t files < <(find "$reports" -type f \( -name 'asan.*' -o -name 'ubsan.*' -o -name 'tsan.*' \))
if ((${#files[@]} == 0)); then
  echo "sanitizer reports: none"
else
  echo "sanitizer reports: ${#files[@]} file(s) in $reports, by test:"
  for d in "$reports"/*/; do
    n=$(find "$d" -type f | wc -l)
    ((n > 0)) && echo "  $(basename "$d"): $n"
  done
  echo "distinct reports (headline @ first zcc frame):"
  for f in "${files[@]}"; do
    awk -v ws="$PWD" '
      function flush() { if (head != "") { print head " @ " (frame != "" ? frame : first); } head = ""; frame = ""; first = "" }
      /(ERROR|WARNING): (Address|Leak|Thread|UndefinedBehavior)Sanitizer|runtime error:/ { flush(); head = $0; sub(/^==[0-9]+==/, "", head); next }
      head != "" && /^ +#[0-9]+ / {
        # ASan: "#1 0x... in fn file:line"; TSan: "#1 fn file:line (module+0x...)".
        loc = $NF
        for (i = 2; i <= NF; ++i) if ($i ~ /\.(cc|cpp|h|hpp|c):[0-9]+(:[0-9]+)?$/) { loc = $i; break }
        if (first == "") first = loc
        if (frame == "" && (index(loc, ws) == 1 || loc ~ /^(checkpoint|client|common|copy|daemon|format|shm|storage|ema|sharding|metrics|config|tools|tests|fuzz)\//)) frame = loc
      }
      END { flush() }' "$f"
  done | sed -E 's/ \(pid=[0-9]+\)//; s/0x[0-9a-f]+/0x…/g' | sort | uniq -c | sort -rn | head -40
fi
echo "reports directory: $reports"

status=0
((bazel_rc == 0 && failed == 0 && ${#files[@]} == 0)) || status=1
exit $status
