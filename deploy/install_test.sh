#!/usr/bin/env bash
# deploy/install.sh into a scratch prefix: installs everything, changes
# nothing on a second run or with --dry-run, keeps an edited config, and
# refuses a missing build.
set -uo pipefail
dir="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-zcc}/deploy"
[[ -d $dir ]] || dir="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A stand-in bazel-bin with the two binaries.
bin="$tmp/bazel-bin"
mkdir -p "$bin/daemon" "$bin/tools"
printf '#!/bin/sh\necho zccd\n' >"$bin/daemon/zccd"
printf '#!/bin/sh\necho zccctl\n' >"$bin/tools/zccctl"
chmod +x "$bin/daemon/zccd" "$bin/tools/zccctl"
root="$tmp/root"

# Lists every path under the prefix with its mode and checksum.
snapshot() { (cd "$root" 2>/dev/null && find . -printf '%p %m\n' | sort && find . -type f -exec md5sum {} + | sort); }

out=$(bash "$dir/install.sh" --bin-dir "$bin" --prefix "$root" --dry-run 2>&1) || fail "dry run failed: $out"
[[ ! -e $root ]] || fail "--dry-run created $root"
grep -q "Dry run" <<<"$out" || fail "dry run does not say so"

out=$(bash "$dir/install.sh" --bin-dir="$bin" --prefix="$root" 2>&1) || fail "install failed: $out"
for f in usr/local/bin/zccd usr/local/bin/zccctl; do
  [[ -x $root/$f ]] || fail "$f not installed executable"
done
cmp -s "$dir/zccd.service" "$root/etc/systemd/system/zccd.service" || fail "unit not installed"
cmp -s "$dir/zccd.conf.example" "$root/etc/zcc/zccd.conf" || fail "config not installed"
[[ -f $root/usr/local/share/doc/zcc/README.md ]] || fail "README not installed"
[[ -d $root/var/lib/zcc/checkpoints ]] || fail "checkpoint root not created"
[[ $(stat -c %a "$root/etc/systemd/system/zccd.service") == 644 ]] || fail "unit mode"
[[ $(stat -c %a "$root/usr/local/bin/zccd") == 755 ]] || fail "binary mode"

# Idempotent: a second run changes nothing; an edited config is kept.
echo "keep_last: 9" >>"$root/etc/zcc/zccd.conf"
before=$(snapshot)
out=$(bash "$dir/install.sh" --bin-dir "$bin" --prefix "$root" 2>&1) || fail "second install failed: $out"
[[ $(snapshot) == "$before" ]] || fail "second run changed files"
grep -q "^+ " <<<"$out" && fail "second run ran commands: $out"
grep -q "keep_last: 9" "$root/etc/zcc/zccd.conf" || fail "edited config overwritten"

# A new binary is installed; the dry run only reports it.
printf '#!/bin/sh\necho zccd v2\n' >"$bin/daemon/zccd"
out=$(bash "$dir/install.sh" --bin-dir "$bin" --prefix "$root" --dry-run 2>&1)
grep -q "install -D -m 0755 .*/usr/local/bin/zccd" <<<"$out" || fail "dry run does not report the new binary"
[[ $(snapshot) == "$before" ]] || fail "dry run changed files"
bash "$dir/install.sh" --bin-dir "$bin" --prefix "$root" >/dev/null 2>&1 || fail "update failed"
grep -q "v2" "$root/usr/local/bin/zccd" || fail "new binary not installed"

# Refusals.
bash "$dir/install.sh" --bin-dir "$tmp/nowhere" --prefix "$root" >/dev/null 2>&1 &&
  fail "accepted a missing build"
bash "$dir/install.sh" --bin-dir "$bin" --prefix "$root" --enable >/dev/null 2>&1 &&
  fail "accepted --enable with --prefix"
bash "$dir/install.sh" --bogus >/dev/null 2>&1 && fail "accepted an unknown option"
bash "$dir/install.sh" --prefix relative >/dev/null 2>&1 && fail "accepted a relative prefix"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: install.sh"
