#!/usr/bin/env bash
# Checks deploy/zccd.service with `systemd-analyze verify` (syntax, known
# keys, valid values) and for the settings zccd depends on.
set -uo pipefail

unit_src="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-zcc}/deploy/zccd.service"
[[ -f $unit_src ]] || unit_src="$(dirname "$0")/zccd.service"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "FAIL: systemd-analyze not found: install systemd (tools/setup.sh does)"
  exit 1
fi

# `verify` checks that ExecStart's binary exists: point it at /bin/true and
# keep the flags.
mkdir -p "$tmp/unit"
unit="$tmp/unit/zccd.service"
sed -E 's#^ExecStart=/usr/local/bin/zccd( |$)#ExecStart=/bin/true\1#' "$unit_src" >"$unit"
grep -qx 'ExecStart=/bin/true --config=/etc/zcc/zccd.conf' "$unit" ||
  fail "ExecStart is not '/usr/local/bin/zccd --config=/etc/zcc/zccd.conf'"

# verify exits 0 on unknown keys and bad values (it only warns), so any
# output is a failure too.
verify() {
  (cd "$(dirname "$1")" && systemd-analyze verify --man=no "./$(basename "$1")" 2>&1)
}
out=$(verify "$unit")
rc=$?
if [[ $rc -ne 0 || -n $out ]]; then
  fail "systemd-analyze verify (exit $rc):"
  echo "$out"
fi

# The check itself must notice mistakes.
sed 's/^Restart=on-failure$/Restart=sometimes\nNoSuchKey=1/' "$unit" >"$tmp/unit/broken.service"
broken=$(verify "$tmp/unit/broken.service")
[[ $broken == *NoSuchKey* && $broken == *sometimes* ]] ||
  fail "systemd-analyze verify did not report a broken unit: $broken"

# Settings zccd relies on.
for line in Type=notify NotifyAccess=main WatchdogSec=30 Restart=on-failure RestartSec=2 \
    LimitMEMLOCK=infinity RuntimeDirectory=zcc RuntimeDirectoryMode=0755 StateDirectory=zcc \
    ProtectSystem=strict ReadWritePaths=/var/lib/zcc NoNewPrivileges=yes PrivateTmp=yes \
    ProtectHome=read-only ProtectKernelTunables=yes ProtectKernelModules=yes \
    ProtectControlGroups=yes 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6' \
    LockPersonality=yes; do
  grep -qx "$line" "$unit_src" || fail "missing '$line'"
done
# Settings that would break it: trainers must share /dev/shm with zccd, the
# GPU device nodes must stay reachable, CUDA JITs code, and live trainers'
# segments must not be removed.
for pattern in '^PrivateDevices=(yes|true|1)' '^PrivateIPC=(yes|true|1)' \
    '^MemoryDenyWriteExecute=(yes|true|1)' '^ProtectClock=(yes|true|1)' \
    '^DevicePolicy=(closed|strict)' '^DeviceAllow=' '^RemoveIPC=(yes|true|1)' \
    '^DynamicUser=(yes|true|1)' '^PrivateUsers=(yes|true|1)'; do
  grep -Eq "$pattern" "$unit_src" && fail "must not set ${pattern#^}"
done

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: zccd.service verifies"
