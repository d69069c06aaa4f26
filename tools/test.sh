#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh) and runs the whole test suite: unit
# tests of every module, Python tests, integration, scenario, isolation, ops
# and crash tests that start real zccd and trainer processes, a short fuzz
# run, clang's thread-safety analysis, and the portable wheels (one per
# CPython, tools/wheel/portable_test.sh). Ends with one line
# "N passed, M failed" counting test cases; exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
source tools/bazel_flags.sh

start=$(date +%s)
bazel test "${ZCC_BAZEL_FLAGS[@]}" --keep_going //... 2>&1 | tee /tmp/zcc-test.$$.log
bazel_rc=${PIPESTATUS[0]}

# Count test cases from each test's log: Catch2 prints its own totals; any
# other test (shell) counts as one case, passed or failed by its status.
passed=0
failed=0
not_run=()
testlogs=$(bazel info "${ZCC_BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)
# Manual tests (GPU-only: tools/gpu/run_gpu_checks.sh runs them) are not run here.
for target in $(bazel query 'tests(//...) except attr(tags, manual, tests(//...))' 2>/dev/null); do
  rel=${target#//}
  rel=${rel/://}
  log="$testlogs/$rel/test.log"
  if grep -q "^$target .*SKIPPED" /tmp/zcc-test.$$.log; then
    # Incompatible with this build (tests of nvcc-compiled code without
    # nvcc): not run, and said so below, neither passed nor failed.
    not_run+=("$target")
    continue
  fi
  if ! grep -q "^$target .*PASSED" /tmp/zcc-test.$$.log && ! grep -q "^$target .*FAILED" /tmp/zcc-test.$$.log; then
    # Not run (failed to build, or no status): one failed case.
    failed=$((failed + 1))
    continue
  fi
  if [[ -f $log ]] && line=$(grep -E "All tests passed \(.* in [0-9]+ test cases?\)" "$log" | tail -1); then
    n=$(sed -E 's/.* in ([0-9]+) test cases?\)/\1/' <<<"$line")
    passed=$((passed + n))
  elif [[ -f $log ]] && line=$(grep -E "^test cases: +[0-9]+ \|" "$log" | tail -1); then
    p=$(sed -E 's/.*\| +([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*\| +([0-9]+) failed.*/\1/' <<<"$line")
    [[ $p =~ ^[0-9]+$ ]] || p=0
    [[ $f =~ ^[0-9]+$ ]] || f=1
    passed=$((passed + p))
    failed=$((failed + f))
  elif grep -q "^$target .*PASSED" /tmp/zcc-test.$$.log; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
rm -f /tmp/zcc-test.$$.log
if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi

# A short fuzz run (10 s per libFuzzer target, built with clang outside
# Bazel) over the committed corpora: one case, failed on any crash.
if bash fuzz/run.sh --ci 2>&1 | tail -12; then
  passed=$((passed + 1))
else
  echo "fuzz: a target crashed (see fuzz/out/crashes/)"
  failed=$((failed + 1))
fi

# Clang's -Wthread-safety over every source file (gcc, which builds zcc,
# ignores the ABSL_GUARDED_BY annotations): one case.
if bash tools/thread_safety.sh 2>&1 | tail -30; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
# The portable wheels: built for every CPython 3.10-3.13, installed into fresh
# venvs here and in a minimal Debian root file system (its checks are cases).
wheel_start=$(date +%s)
wheel_out=$(bash tools/wheel/portable_test.sh 2>&1)
grep -E "^(PASS|FAIL|==|portable_test)" <<<"$wheel_out" | cut -c1-400
if line=$(grep -E "^portable_test: [0-9]+ passed, [0-9]+ failed$" <<<"$wheel_out"); then
  passed=$((passed + $(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")))
  failed=$((failed + $(sed -E 's/.*, ([0-9]+) failed/\1/' <<<"$line")))
else
  tail -30 <<<"$wheel_out"
  failed=$((failed + 1))
fi
echo "portable wheels: $(( $(date +%s) - wheel_start ))s"
echo "test wall time: $(( $(date +%s) - start ))s"
if ((${#not_run[@]} > 0)); then
  echo "not run in this build (they need nvcc): ${not_run[*]}"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
