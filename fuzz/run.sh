#!/usr/bin/env bash
# Builds (fuzz/build.sh) and runs every libFuzzer target for a while over its
# seed corpus and saved regression inputs; fails on any crash.
#
#   fuzz/run.sh                      # 60 s per target
#   fuzz/run.sh --seconds 300        # longer
#   fuzz/run.sh --ci                 # short run for CI: 10 s per target
#   fuzz/run.sh --seconds 5 safetensors_header rank_manifest   # some targets only
#
# The committed corpus fuzz/corpus/<target>/ is read, never written: new
# inputs go to fuzz/out/work/<target>/ (kept between runs, so longer runs
# build on earlier ones; --ci starts it afresh). A crashing input is saved as
# fuzz/out/crashes/<target>/crash-<sha1> and the run fails; once the bug is
# understood, copy the input to fuzz/regressions/<target>/ so that
# //fuzz:regressions_test replays it in the normal test suite.
#
# Prints one line per target with its executions (libFuzzer's
# stat::number_of_executed_units) and ends with "fuzz: N targets, M crashed".
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=60
ci=0
only=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --ci) ci=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done
if ((ci)) && [[ $seconds == 60 ]]; then seconds=10; fi
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "fuzz/run.sh: bad --seconds" >&2; exit 2; }

bash fuzz/build.sh || { echo "fuzz: build failed"; exit 1; }

# target:max_len:dictionary
TARGETS=(
  safetensors_header:8192:json.dict
  rank_manifest:8192:json.dict
  commit_record:2048:json.dict
  weight_map_index:4096:json.dict
  register_request:4096:
  register_structured:256:
  control_block:1024:
  step_dir_latest:5000:step_dir.dict
  piece_assembly:1024:
)

OUT=fuzz/out
mkdir -p "$OUT/logs"
crashed=0
ran=0
printf '%-22s %10s %10s %8s  %s\n' target executions exec/s corpus result
for entry in "${TARGETS[@]}"; do
  IFS=: read -r name max_len dict <<<"$entry"
  if ((${#only[@]})) && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  work=$OUT/work/$name
  crashes=$OUT/crashes/$name
  ((ci)) && rm -rf "$work"
  mkdir -p "$work" "$crashes" "fuzz/regressions/$name"
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -max_len="$max_len" -artifact_prefix="$crashes/" -close_fd_mask=1)
  [[ -n $dict ]] && args+=(-dict="fuzz/dict/$dict")
  log=$OUT/logs/$name.log
  # Scratch space for targets that write files (step_dir_latest), removed
  # here once the process is gone.
  scratch=$(mktemp -d /tmp/zcc-fuzz.XXXXXX)
  TEST_TMPDIR=$scratch "$OUT/$name" "${args[@]}" "$work" "fuzz/corpus/$name" \
    "fuzz/regressions/$name" >"$log" 2>&1
  rc=$?
  rm -rf "$scratch"
  ran=$((ran + 1))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  per_s=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if [[ -z $execs ]]; then
    # No final stats (a crash): the last status line has the count.
    execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  fi
  corpus=$(find "$work" -type f | wc -l)
  result=ok
  if ((rc != 0)) || grep -q -E '^==[0-9]+==ERROR|fuzz check failed|runtime error:' "$log"; then
    result="CRASH (rc=$rc; see $log, inputs in $crashes/)"
    crashed=$((crashed + 1))
  fi
  printf '%-22s %10s %10s %8s  %s\n' "$name" "${execs:-?}" "${per_s:-?}" "$corpus" "$result"
done
echo "fuzz: $ran targets, $crashed crashed (${seconds}s each)"
((crashed == 0))
