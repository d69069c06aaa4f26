#!/bin/bash
# zccctl export end to end: writes and commits a sliced 4-rank step
# (checkpoint/testing/write_sliced_step), exports it several ways with
# zccctl, and checks the output with the reference `safetensors` Python
# package (and PyTorch where installed): export_python_test.py. Also checks
# zccctl's output lines, --json, and its refusals. Fails, rather than skips,
# when no Python can import safetensors and numpy: tools/setup.sh installs them.
set -euo pipefail

runfiles="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-zcc}"
zccctl="$runfiles/tools/zccctl"
writer="$runfiles/checkpoint/testing/write_sliced_step"
checker="$runfiles/tools/export_python_test.py"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

source "$runfiles/tools/testing/find_python.sh"

fail() { echo "FAIL: $*" >&2; exit 1; }

model=(--layers 2 --hidden 16 --intermediate 12 --vocab 37)
step_dir=$("$writer" "$tmp/job" --step 42 "${model[@]}")
[[ -f "$step_dir/COMMITTED" ]] || fail "no committed step at $step_dir"
echo '{"model_type": "zcc-test"}' > "$tmp/config.json"

# Several shards of at most 2 KB (2,000 bytes), with a config file.
"$zccctl" export "$step_dir" "$tmp/sharded" --max-shard-size 2KB \
  --extra-file "$tmp/config.json" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "export"; }
cat "$tmp/out" "$tmp/err"
grep -Eq '^exported 14 param tensors in [0-9]+ shard\(s\) to .*sharded: [0-9.]+ GB written \([0-9.]+ GB read and verified\) in [0-9.]+s \([0-9.]+ GB/s\)$' \
  "$tmp/out" || fail "summary line: $(cat "$tmp/out")"
shards=$(ls "$tmp/sharded" | grep -c '^model-.*\.safetensors$')
[[ $(grep -Ec '^\[[0-9]+/[0-9]+\] model-[0-9]{5}-of-[0-9]{5}\.safetensors: [0-9]+ tensors, [0-9.]+ MB, [0-9]+ MB/s$' \
  "$tmp/err") == "$shards" ]] || fail "expected one progress line per shard ($shards)"

# --json, bf16; f16; the EMA.
"$zccctl" --json export "$step_dir" "$tmp/bf16" --dtype bf16 >"$tmp/json"
cat "$tmp/json"
"$python" -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['ok'] and r['shards']==1 \
  and not r['indexed'] and r['tensors']==14, r" "$tmp/json"
"$zccctl" export "$step_dir" "$tmp/f16" --dtype f16 >/dev/null 2>&1
"$zccctl" export "$step_dir" "$tmp/ema" --what ema >/dev/null 2>&1

"$python" "$checker" "${model[@]}" --max-shard-bytes 2000 --sharded "$tmp/sharded" \
  --bf16 "$tmp/bf16" --f16 "$tmp/f16" --ema "$tmp/ema"

# Refusals: a non-empty OUT_DIR (exit 1, named), a bad size (usage, exit 2),
# a step directory that is not committed; --force writes into it.
set +e
"$zccctl" export "$step_dir" "$tmp/sharded" 2>"$tmp/err"; code=$?
set -e
[[ $code == 1 ]] && grep -q "not empty" "$tmp/err" || fail "non-empty OUT_DIR: $code $(cat "$tmp/err")"
set +e
"$zccctl" export "$step_dir" "$tmp/x" --max-shard-size 5Gb 2>"$tmp/err"; code=$?
set -e
[[ $code == 2 ]] && grep -q "bits" "$tmp/err" || fail "bad size: $code $(cat "$tmp/err")"
[[ ! -e "$tmp/x" ]] || fail "a refused export created its OUT_DIR"
set +e
"$zccctl" --json export "$tmp" "$tmp/y" >"$tmp/json"; code=$?
set -e
[[ $code == 1 ]] && grep -q '"ok": false' "$tmp/json" || fail "uncommitted: $code $(cat "$tmp/json")"
"$zccctl" export "$step_dir" "$tmp/sharded" --force --max-shard-size 1GB >/dev/null 2>&1
[[ $(ls "$tmp/sharded" | sort | tr '\n' ' ') == "config.json model.safetensors " ]] ||
  fail "--force: $(ls "$tmp/sharded")"
echo "PASS"
