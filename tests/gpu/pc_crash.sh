#!/usr/bin/env bash
# GPU check that PC sampling never crashes its host, on a machine with NVIDIA GPUs, CUDA 13 and
# PyTorch: for SECS seconds (default 240) gpuprofd's always-on profile samples PROCS (default 2)
# bf16 matmul processes sharing each GPU (every GPU of the machine, or GPUS="0 1"), each
# running RUN seconds (default 20, MM_BATCH matmuls between synchronizations, default 10) and
# started again, so the sampler turns over between processes about every second and opens,
# closes and finalizes windows hundreds of times. Every process runs with Python's
# faulthandler on (pc_common.sh) and core dumps on (anonymous memory only); one that dies by
# a signal has its Python stacks, where it crashed (core_summary.py: the faulting thread's instruction pointer
# and a stack scan, symbolized with unstripped builds in $BIN/debug when there) and the last
# lines of its injector log printed (CRASH_LOG: the injectors' log level, default debug).
# Checks: no process died; every process was sampled. Binaries: release builds in .gpu/ (or
# GPUPROF_BIN). Summary last; logs to $OUT.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=pc_crash
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
SECS=${SECS:-240}
RUN=${RUN:-20}
PROCS=${PROCS:-2}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | tr '\n' ' ')}
export GPUPROF_LOG=${CRASH_LOG:-debug}
echo "core pattern: $(cat /proc/sys/kernel/core_pattern 2>/dev/null); gdb: $(command -v gdb || echo none)"
start_gpuprofd 'log_level = "info"
[pc]
always_on = true'

# One slot (GPU, index) runs processes back to back until the time is up; each process's
# outcome goes to $STATE/outcomes as "tag exit-status".
slot() {
  local gpu=$1 i=$2 n=0 t_end=$(($(date +%s) + SECS))
  while [ "$(date +%s)" -lt "$t_end" ]; do
    n=$((n + 1))
    local tag="g${gpu}_${i}_$n"
    mkdir -p "$STATE/cwd/$tag"
    (
      cd "$STATE/cwd/$tag" || exit 1
      ulimit -c unlimited
      echo 0x1 >/proc/self/coredump_filter 2>/dev/null
      GPUPROF_LOG_FILE="$STATE/logs/$tag.log" CUDA_VISIBLE_DEVICES=$gpu CUDA_INJECTION64_PATH="$INJ" \
        exec "$PY" "$HERE/mm.py" "$RUN" 1 8192 "${MM_BATCH:-10}" >"$STATE/$tag.txt" 2>&1
    )
    local rc=$?
    echo "$tag $rc" >>"$STATE/outcomes"
    local core
    core=$(ls "$STATE/cwd/$tag"/core* 2>/dev/null | head -1)
    if [ -n "$core" ]; then
      "$PY" "$HERE/core_summary.py" "$core" --symbols "$BIN/debug" >"$STATE/$tag.core.txt" 2>&1
      rm -f "$STATE/cwd/$tag"/core*
    fi
  done
}
SLOTS=()
for g in $GPUS; do
  for i in $(seq "$PROCS"); do
    slot "$g" "$i" &
    SLOTS+=($!)
  done
done
wait "${SLOTS[@]}" # not gpuprofd

total=$(wc -l <"$STATE/outcomes")
bad=$(awk '$2 != 0' "$STATE/outcomes")
n_bad=$(grep -c . <<<"$bad")
for tag in $(awk '$2 != 0 {print $1}' "$STATE/outcomes"); do
  echo "=== $tag died ($(awk -v t="$tag" '$1 == t {print $2}' "$STATE/outcomes"))"
  tail -40 "$STATE/$tag.txt"
  [ -f "$STATE/$tag.core.txt" ] && { echo "--- where (core_summary.py)"; cat "$STATE/$tag.core.txt"; }
  echo "--- its injector log, last lines"
  tail -25 "$STATE/logs/$tag.log" | cut -c1-300
done
# Sampled: a window of the process closed with samples (its injector log says so).
unsampled=0; finished=0
for f in "$STATE"/g*_*.txt; do
  grep -q "ms_per_iter" "$f" || continue
  finished=$((finished + 1))
  grep -qE "window closed .* [1-9][0-9]* samples" "$STATE/logs/$(basename "$f" .txt).log" 2>/dev/null || unsampled=$((unsampled + 1))
done
figure "$total processes on GPUs [$GPUS], $PROCS at a time per GPU, ${RUN}s each, for ${SECS}s; died: $n_bad; finished $finished, of them with no window that kept samples: $unsampled"
pass_if "no process died while PC-sampled" "$([ "$total" -gt 0 ] && [ "$n_bad" = 0 ] && echo 1)" "$n_bad of $total${bad:+: $(tr '\n' ' ' <<<"$bad")}"
pass_if "every finished process was sampled" "$([ "$finished" -gt 0 ] && [ "$unsampled" = 0 ] && echo 1)" "$unsampled of $finished without samples"
