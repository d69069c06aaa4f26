#!/usr/bin/env bash
# Clang's thread-safety analysis over zcc's C++ sources:
#
#   tools/thread_safety.sh            # every source file; exit 1 on any finding
#   tools/thread_safety.sh FILE...    # some files only
#
# The build itself uses gcc, which ignores ABSL_GUARDED_BY and friends; this
# runs clang++ -fsyntax-only -Wthread-safety -Werror over each translation
# unit (no code generation, so it is quick), with the generated protobuf
# headers from Bazel. It first checks itself: a snippet that reads a guarded
# field without its lock must be refused, so a setup in which the analysis
# silently does nothing fails here instead of passing.
#
# Files that are not checked: CUDA sources with kernels (clang 14 does not
# know CUDA 13; cuda_copier.cu has no kernels and is checked as C++), and
# fuzz/libfuzzer_main.cc (a template built once per fuzz target).
set -euo pipefail
cd "$(dirname "$0")/.."

clang=${ZCC_CLANGXX:-clang++-14}
if ! command -v "$clang" >/dev/null; then
  echo "thread_safety: $clang not found (tools/setup.sh installs clang-14)" >&2
  exit 1
fi
source tools/bazel_flags.sh
bazel build "${ZCC_BAZEL_FLAGS[@]}" //proto:zcc_cc_proto >/dev/null 2>&1 ||
  { echo "thread_safety: cannot build //proto:zcc_cc_proto" >&2; exit 1; }
genfiles=$(bazel info "${ZCC_BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)

flags=(-fsyntax-only -std=c++17 -Wthread-safety -Werror=thread-safety -Wno-unknown-warning-option
       -I. -I"$genfiles" -I/usr/local/cuda/include $(python3-config --includes))
pybind=$(python3 -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null || true)
[[ -n $pybind ]] && flags+=(-I"$pybind")

# The analysis must see zcc::Mutex: an unguarded read is an error.
probe=$(mktemp --suffix=.cc)
trap 'rm -f "$probe"' EXIT
cat >"$probe" <<'EOF'
#include "common/mutex.h"
class Probe {
 public:
  int Read() { return value_; }  // no lock held: must be refused
 private:
  zcc::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};
int ProbeRead(Probe& p) { return p.Read(); }
EOF
if "$clang" "${flags[@]}" "$probe" >/dev/null 2>&1; then
  echo "thread_safety: the analysis did not refuse an unguarded read; it is not working" >&2
  exit 1
fi

if (($# > 0)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.cc' 'cuda/cuda_copier.cu' |
                         grep -v -e '^third_party/' -e '^fuzz/libfuzzer_main.cc$')
fi

logs=$(mktemp -d)
trap 'rm -f "$probe"; rm -rf "$logs"' EXIT
start=$(date +%s)
check() {  # FILE LOGDIR CLANG FLAGS...
  local file=$1 logdir=$2 clang=$3
  shift 3
  local lang=()
  [[ $file == *.cu ]] && lang=(-x c++)
  "$clang" "$@" "${lang[@]}" "$file" >"$logdir/$(tr / _ <<<"$file").log" 2>&1 ||
    echo "$file" >>"$logdir/failed"
}
export -f check
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -I{} bash -c 'check "$@"' _ {} "$logs" "$clang" "${flags[@]}"

if [[ -s $logs/failed ]]; then
  while read -r f; do
    echo "=== $f"
    cat "$logs/$(tr / _ <<<"$f").log"
  done <"$logs/failed"
  echo "thread_safety: $(wc -l <"$logs/failed") of ${#files[@]} files failed ($(( $(date +%s) - start ))s)"
  exit 1
fi
echo "thread_safety: ${#files[@]} files clean under $clang -Wthread-safety ($(( $(date +%s) - start ))s)"
