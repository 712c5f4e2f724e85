#!/usr/bin/env bash
# Fails when deploy/gpuprofd.service exposes more than MAX (default 3.0) on systemd's scale
# (`systemd-analyze security`, 0 = locked down, 10 = fully exposed). Run from .ci/run.
set -euo pipefail
cd "$(dirname "$0")"
max="${1:-3.0}"
unit=gpuprofd.service
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "!!! systemd-analyze not found: NOT CHECKING the hardening of deploy/$unit !!!" >&2
  echo "!!! (apt-get install systemd, or run this on a systemd host)               !!!" >&2
  exit 0
fi
out="$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1)" || true
score="$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' | tail -1)"
if [ -z "$score" ]; then
  printf '%s\n' "$out" >&2
  echo "check-unit: systemd-analyze gave no exposure level for $unit" >&2
  exit 1
fi
if awk -v s="$score" -v m="$max" 'BEGIN { exit !(s > m) }'; then
  printf '%s\n' "$out" | grep '✗' >&2 || true
  echo "check-unit: $unit exposure $score is above $max (the settings marked ✗ above are what is left)" >&2
  exit 1
fi
echo "check-unit: $unit exposure $score (at most $max)"
