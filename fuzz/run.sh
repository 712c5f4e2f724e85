#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 60) with libFuzzer through cargo-fuzz, starting
# from the checked-in corpus (fuzz/corpus/<target>, read only: new inputs go to a scratch
# directory), prints each target's executions, and fails if any target crashes (the input is
# then in fuzz/artifacts/<target>/). Needs a nightly toolchain; installs cargo-fuzz if missing.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# No sanitizer: the code under test is safe Rust, and ASan would halve the executions. Debug
# assertions (overflow checks) stay on.
flags=(--sanitizer none --debug-assertions)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build "${flags[@]}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  log="$scratch/$t.log"
  start=$(date +%s)
  if cargo +nightly fuzz run "${flags[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    status=ok
  else
    status=CRASHED
    failed+=("$t")
    tail -n 60 "$log" >&2
  fi
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -n 1)
  elapsed=$(( $(date +%s) - start ))
  echo "fuzz $t: $status, ${execs:-?} executions in ${elapsed}s ($(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))/s)"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets that crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
