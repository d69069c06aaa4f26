#!/usr/bin/env bash
# Soak run of the crash matrix (tests/crash_test.cc): N zccd-kill trials and
# N/8 (at least 6) trials of each trainer-kill kind, with seeds starting at
# SEED (default: a new one each run, printed so a failure can be replayed).
#
#   tests/crash_soak.sh 500            # ~20 minutes on 2 cores
#   tests/crash_soak.sh 200 24301      # replay a run (the default test uses seed 24301)
#
# Builds with the normal flags (tools/bazel_flags.sh) and runs the test through
# `bazel test` with a timeout sized to N. Set ZCC_BAZEL_OUTPUT_BASE to build in
# a separate output base. Prints the test's fault tally; exits non-zero if any
# trial failed.
set -uo pipefail
cd "$(dirname "$0")/.."

trials=${1:-200}
seed=${2:-$(( $(date +%s) % 1000000 ))}
[[ $trials =~ ^[0-9]+$ && $seed =~ ^[0-9]+$ ]] || {
  echo "usage: tests/crash_soak.sh N [SEED]" >&2
  exit 2
}
trainer_trials=$(( trials / 8 > 6 ? trials / 8 : 6 ))

source tools/bazel_flags.sh
bazel=(bazel)
[[ -n ${ZCC_BAZEL_OUTPUT_BASE:-} ]] && bazel+=(--output_base="$ZCC_BAZEL_OUTPUT_BASE")
# About 3 s per daemon-kill trial and 2 s per trainer-kill trial, doubled.
timeout=$(( (trials * 3 + trainer_trials * 4) * 2 + 120 ))

echo "crash soak: $trials zccd-kill trials, $trainer_trials of each trainer-kill kind, seed $seed"
start=$(date +%s)
"${bazel[@]}" test "${ZCC_BAZEL_FLAGS[@]}" --symlink_prefix=/ //tests:crash_test \
  --test_env=ZCC_CRASH_TRIALS="$trials" --test_env=ZCC_CRASH_TRAINER_TRIALS="$trainer_trials" \
  --test_env=ZCC_CRASH_SEED="$seed" --test_timeout="$timeout" --cache_test_results=no \
  --test_output=streamed
rc=$?
echo "crash soak: seed $seed, $(( $(date +%s) - start ))s, $([[ $rc -eq 0 ]] && echo passed || echo FAILED)"
exit "$rc"
