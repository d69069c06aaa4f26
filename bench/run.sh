#!/usr/bin/env bash
# Builds the benchmarks optimised and runs them; prints one table and, with
# --json FILE, writes the rows as a JSON array (fields: name, value, reference,
# ratio, target, unit; ratio = value/reference, higher is better unless the
# row's name says otherwise).
#
#   bench/run.sh [--quick] [--only PATTERN] [--json FILE] [--dir DIR]
#
# --quick runs a ~2 minute version; --only PATTERN (an extended regex) selects
# benchmarks or rows: when it matches the names of some benchmark binaries
# (snapshot_bench, e2e_bench, ...) those run whole; otherwise every binary runs
# with --only=PATTERN (e2e_bench, scale_bench, ema_bench and torch_bench then
# skip the work of unwanted rows; the others run whole) and only the rows whose
# "binary:row" matches are kept; --dir is the directory the disk benchmarks
# write to (default: a temporary directory under the repository's parent, i.e.
# on the same disk as the work tree, removed afterwards).
#
# Environment: ZCC_BAZEL_OUTPUT_BASE runs Bazel with that --output_base (default:
# Bazel's own); the repository's bazel-* symlinks are never touched.
# torch_bench needs PyTorch 2.x: ZCC_TORCH_PYTHON names the interpreter, else
# it uses the venv tools/setup.sh makes, see bench/torch/torch_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=""
only=""
json=""
dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick="--quick"; shift ;;
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --json) json=$2; shift 2 ;;
    --json=*) json=${1#--json=}; shift ;;
    --dir) dir=$2; shift 2 ;;
    --dir=*) dir=${1#--dir=}; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -n $json && $json != /* ]]; then json="$PWD/$json"; fi

bash tools/setup.sh
source tools/bazel_flags.sh
startup=()
[[ -n ${ZCC_BAZEL_OUTPUT_BASE:-} ]] && startup+=(--output_base="$ZCC_BAZEL_OUTPUT_BASE")
# C++ binaries, and sh_binary runners of Python benchmarks (bench/torch).
mapfile -t targets < <(bazel "${startup[@]}" query 'attr(tags, "zcc_bench", kind("(cc|sh)_binary", //bench/...))' 2>/dev/null)
if [[ ${#targets[@]} -eq 0 ]]; then echo "bench: no benchmarks found" >&2; exit 1; fi
bazel "${startup[@]}" build "${ZCC_BAZEL_FLAGS[@]}" --config=opt --symlink_prefix=/ \
  "${targets[@]}" //daemon:zccd
bin=$(bazel "${startup[@]}" info "${ZCC_BAZEL_FLAGS[@]}" --config=opt bazel-bin 2>/dev/null)

made_dir=""
if [[ -z $dir ]]; then
  dir=$(mktemp -d "$(cd .. && pwd)/zcc-bench.XXXXXX")
  made_dir=$dir
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rows=$(mktemp)
trap 'rm -f "$rows"; if [[ -n $made_dir ]]; then rm -rf "$made_dir"; fi' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
failed=()
names_match=""
for t in "${targets[@]}"; do
  if [[ -n $only ]] && grep -qE -- "$only" <<<"${t##*:}"; then names_match=1; fi
done
for t in "${targets[@]}"; do
  name=${t##*:}
  path=${t#//}
  path=${path/://}
  pattern=""
  if [[ -n $only ]] && ! grep -qE -- "$only" <<<"$name"; then
    [[ -n $names_match ]] && continue  # the pattern selects binaries, not this one
    pattern=$only                      # the pattern selects rows
  fi
  echo "== $name (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  # Rows go to a file rather than a pipe: a zccd left behind by a benchmark
  # that died would hold a pipe open forever.
  out="$dir/.rows-$name"
  status=0
  ZCC_BENCH_DIR="$dir" ZCC_ZCCD="$bin/daemon/zccd" "$bin/$path" $quick --only="$pattern" >"$out" || status=$?
  cat "$out" >&2
  sed -n "s/^BENCH_ROW /$name\t/p" "$out" >>"$rows"
  rm -f "$out"
  if [[ $status -ne 0 ]]; then
    echo "bench: $name failed (exit status $status)" >&2
    failed+=("$name")
  fi
  # Any zccd this benchmark started and left running (its socket is in $dir).
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    if [[ $cmd == "$bin/daemon/zccd --socket=$dir/"* ]]; then
      echo "bench: stopping zccd ${p#/proc/} left behind by $name" >&2
      kill "${p#/proc/}" 2>/dev/null || true
    fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$(( $(date +%s) - started ))

python3 - "$rows" "$json" "$only" "$load_before" "$load_after" "$elapsed" "$quick" <<'PY'
import json, re, sys, datetime, os
path, out, only, load_before, load_after, elapsed, quick = sys.argv[1:8]
rows = []
for line in open(path):
    if not line.strip():
        continue
    binary, _, text = line.rstrip("\n").partition("\t")
    row = json.loads(text)
    if only and not re.search(only, binary) and not re.search(only, binary + ":" + row["name"]):
        continue
    rows.append(row)
w = max([len(r["name"]) for r in rows] + [4])
tw = max([len(r["target"]) for r in rows] + [6])
print(f"\nzcc benchmarks{' (--quick)' if quick else ''}: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, "
      f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after, {elapsed} s")
print(f"{'row':<{w}}  {'zcc':>12}  {'reference':>12}  {'ratio':>9}  {'target':<{tw}}  unit")
for r in rows:
    print(f"{r['name']:<{w}}  {r['value']:>12.4g}  {r['reference']:>12.4g}  {r['ratio']:>9.3f}  {r['target']:<{tw}}  {r['unit']}")
if out:
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {len(rows)} rows to {out}")
PY
if [[ ${#failed[@]} -gt 0 ]]; then
  # After the table, on stdout too: a run with a failed benchmark has rows
  # missing, and must not read as a complete one.
  echo
  echo "BENCHMARKS FAILED: ${failed[*]} (their rows are missing from the table; the reason is"
  echo "in each one's output above, after its '== NAME' line)"
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
