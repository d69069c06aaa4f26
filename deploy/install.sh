#!/usr/bin/env bash
# Installs zccd under systemd from a Bazel build. Idempotent: files that are
# already up to date are left alone, an existing /etc/zcc/zccd.conf is never
# overwritten, and nothing is started unless --enable is given.
#
#   bazel build -c opt //daemon:zccd //tools:zccctl
#   sudo deploy/install.sh --bin-dir=bazel-bin [--enable]
#
# Options:
#   --bin-dir DIR   Bazel output directory holding daemon/zccd and tools/zccctl
#                   (default: bazel-bin in the repository).
#   --prefix DIR    install below DIR instead of / (staging a package or an
#                   image; systemctl is never run then).
#   --dry-run       print what would change, change nothing.
#   --enable        then systemctl daemon-reload and enable --now zccd.
#
# Installs:
#   /usr/local/bin/zccd, /usr/local/bin/zccctl
#   /etc/systemd/system/zccd.service
#   /etc/zcc/zccd.conf                 (from zccd.conf.example, if absent)
#   /usr/local/share/doc/zcc/README.md (the unit's Documentation=)
#   /var/lib/zcc/checkpoints           (the default checkpoint root)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
bin_dir="$repo/bazel-bin"
prefix=""
dry_run=0
enable=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --bin-dir=*) bin_dir=${1#*=} ;;
    --prefix=*) prefix=${1#*=} ;;
    --bin-dir|--prefix)
      if (($# < 2)); then echo "install.sh: $1 needs a value" >&2; exit 2; fi
      if [[ $1 == --bin-dir ]]; then bin_dir=$2; else prefix=$2; fi
      shift ;;
    --dry-run) dry_run=1 ;;
    --enable) enable=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
prefix=${prefix%/}
if [[ -n $prefix && $prefix != /* ]]; then
  echo "install.sh: --prefix must be an absolute path" >&2
  exit 2
fi
if [[ -n $prefix && $enable -eq 1 ]]; then
  echo "install.sh: --enable only applies to an installation into / (no --prefix)" >&2
  exit 2
fi

for f in daemon/zccd tools/zccctl; do
  if [[ ! -x $bin_dir/$f ]]; then
    echo "install.sh: $bin_dir/$f not found; build it first:" >&2
    echo "  bazel build -c opt //daemon:zccd //tools:zccctl" >&2
    exit 1
  fi
done

changed=0
# Prints and (unless --dry-run) runs a command.
run() {
  echo "+ $*"
  if [[ $dry_run -eq 0 ]]; then "$@"; fi
}

# install_file SRC DEST MODE: copies when DEST is missing or differs; sets
# last_changed. Called outside conditionals, so that set -e stops on a failure.
last_changed=0
install_file() {
  local src=$1 dest=$prefix$2 mode=$3
  last_changed=0
  if [[ -f $dest ]] && cmp -s "$src" "$dest"; then
    echo "  up to date: $dest"
    return 0
  fi
  run install -D -m "$mode" "$src" "$dest"
  changed=1
  last_changed=1
}

install_file "$bin_dir/daemon/zccd" /usr/local/bin/zccd 0755
install_file "$bin_dir/tools/zccctl" /usr/local/bin/zccctl 0755
install_file "$here/zccd.service" /etc/systemd/system/zccd.service 0644
unit_changed=$last_changed
install_file "$here/README.md" /usr/local/share/doc/zcc/README.md 0644

if [[ -e $prefix/etc/zcc/zccd.conf ]]; then
  echo "  kept: $prefix/etc/zcc/zccd.conf (compare with $here/zccd.conf.example)"
else
  run install -D -m 0644 "$here/zccd.conf.example" "$prefix/etc/zcc/zccd.conf"
  changed=1
fi

if [[ -d $prefix/var/lib/zcc/checkpoints ]]; then
  echo "  exists: $prefix/var/lib/zcc/checkpoints"
else
  run mkdir -p -m 0755 "$prefix/var/lib/zcc/checkpoints"
  changed=1
fi

if [[ $enable -eq 1 ]]; then
  run systemctl daemon-reload
  run systemctl enable --now zccd.service
  if [[ $changed -eq 1 ]] && systemctl is-active --quiet zccd.service 2>/dev/null; then
    echo "zccd was already running: 'systemctl restart zccd' runs the new files" \
         "(trainers keep training; snapshots pause while it restarts)."
  fi
elif [[ -z $prefix ]]; then
  if [[ $unit_changed -eq 1 ]]; then echo "Unit changed: run 'systemctl daemon-reload'."; fi
  echo "Not started. Start with: systemctl enable --now zccd (or rerun with --enable)."
fi
if [[ $dry_run -eq 1 ]]; then echo "Dry run: nothing was changed."; fi
