#!/usr/bin/env bash
# Builds the benchmarks optimised and runs them; prints one table and, with
# --json FILE, writes the rows as a JSON array (fields: name, value, reference,
# ratio, target, unit; ratio = value/reference, higher is better unless the
# row's name says otherwise).
#
#   bench/run.sh [--quick] [--only PATTERN] [--json FILE] [--dir DIR]
#
# --quick runs a ~1 minute version; --only runs the benchmarks whose name
# matches PATTERN (a grep -E pattern over "binary:row"); --dir is the directory
# the disk benchmarks write to (default: a temporary directory under the
# repository's parent, i.e. on the same disk as the work tree).
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
    --json) json=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh
source tools/bazel_flags.sh
mapfile -t targets < <(bazel query 'attr(tags, "zcc_bench", kind(cc_binary, //bench/...))' 2>/dev/null)
if [[ ${#targets[@]} -eq 0 ]]; then echo "bench: no benchmarks found" >&2; exit 1; fi
bazel build "${ZCC_BAZEL_FLAGS[@]}" --config=opt "${targets[@]}" //daemon:zccd
bin=$(bazel info "${ZCC_BAZEL_FLAGS[@]}" --config=opt bazel-bin 2>/dev/null)

[[ -n $dir ]] || dir=$(mktemp -d "$(cd .. && pwd)/zcc-bench.XXXXXX")
mkdir -p "$dir"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for t in "${targets[@]}"; do
  name=${t##*:}
  path=${t#//}
  path=${path/://}
  if [[ -n $only ]] && ! grep -qE "$only" <<<"$name" && ! grep -qE "$only" <<<"$name:"; then
    continue
  fi
  echo "== $name" >&2
  ZCC_BENCH_DIR="$dir" ZCC_ZCCD="$bin/daemon/zccd" "$bin/$path" $quick --only="$only" \
    | tee /dev/stderr | sed -n 's/^BENCH_ROW //p' >>"$rows" || echo "bench: $name failed" >&2
done
rm -rf "$dir"/zcc-bench-data 2>/dev/null || true

python3 - "$rows" "$json" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
w = max([len(r["name"]) for r in rows] + [4])
print(f"\n{'row':<{w}}  {'zcc':>12}  {'reference':>12}  {'ratio':>7}  {'target':>8}  unit")
for r in rows:
    print(f"{r['name']:<{w}}  {r['value']:>12.4g}  {r['reference']:>12.4g}  {r['ratio']:>7.3f}  {r['target']:>8}  {r['unit']}")
if sys.argv[2]:
    with open(sys.argv[2], "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {len(rows)} rows to {sys.argv[2]}")
PY
