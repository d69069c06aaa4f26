#!/usr/bin/env bash
# Runs deploy/k8s_manifests_check.py on the Kubernetes manifests.
set -euo pipefail
dir="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-zcc}/deploy"
[[ -d $dir ]] || dir="$(dirname "$0")"
if ! command -v python3 >/dev/null 2>&1; then
  echo "FAIL: python3 not found"
  exit 1
fi
exec python3 "$dir/k8s_manifests_check.py" "$dir/k8s/zccd-daemonset.yaml" \
  "$dir/k8s/trainer-pod-example.yaml"
