#!/usr/bin/env bash
# What PM sampling alone costs a GPU-bound PyTorch matmul loop, by metric set and interval.
# Runs the sampler child standalone (`gpuprof-sampler --print`, no daemon, nothing stored) in
# windows of one long matmul process (tests/gpu/mm_windows.py), alternating with windows where
# nothing samples, and prints the slowdown of each configuration.
# Binaries as for pm_arbiter.sh (.gpu/ or GPUPROF_BIN).
set -uo pipefail
BIN=${GPUPROF_BIN:-$PWD/.gpu}
PY=${PYTHON:-python3}
L=${GPUPROF_CUPTI_LIBRARY:-/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13}
export LD_LIBRARY_PATH="$(dirname "$L"):${LD_LIBRARY_PATH:-}"
REPS=${REPS:-3}
T=$(mktemp -d)
FOUR=gr__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_realtime.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
NODRAM=gr__cycles_active.avg,sm__cycles_active.avg,sm__inst_executed_realtime.avg.per_cycle_active,gr__cycles_elapsed.max
ONE=sm__cycles_active.avg.pct_of_peak_sustained_elapsed
TWO=gr__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
# "INTERVAL METRICS" pairs; CONFIGS_SET=metrics compares metric counts at 1 ms instead.
if [ "${CONFIGS_SET:-}" = one ]; then
  CONFIGS=("1ms $FOUR")
elif [ "${CONFIGS_SET:-}" = metrics ]; then
  CONFIGS=("1ms $ONE" "1ms $TWO" "1ms $FOUR" "1ms $NODRAM")
else
  CONFIGS=("1ms $FOUR" "1ms $NODRAM" "10ms $FOUR" "100ms $FOUR")
fi
HERE=$(cd "$(dirname "$0")" && pwd)
WIN=${WIN:-3}
: >"$T/windows"
# One matmul process throughout; windows with nothing sampling ("off") alternate with windows
# where the standalone sampler runs one configuration ("c<i>"), starting and ending with "off";
# each sampling window is compared with the "off" windows either side of it.
$PY "$HERE/mm_windows.py" run "$T/mm_log" "$T/mm_stop" 900 &
MMW=$!
# SM clock and power draw every 0.2 s, to see whether sampling costs clock (power headroom).
(while [ ! -e "$T/mm_stop" ]; do
  echo "$(date +%s.%N) $(nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits)"; sleep 0.2
done >"$T/gpu_log") &
for _ in $(seq 600); do [ -s "$T/mm_log" ] && break; sleep 0.05; done
sleep 8 # to a steady clock and temperature
window() { # label
  local t0 t1; sleep 0.5; t0=$(date +%s.%N); sleep "$WIN"; t1=$(date +%s.%N); echo "$1 $t0 $t1" >>"$T/windows"
}
window off
for rep in $(seq "$REPS"); do
  for i in "${!CONFIGS[@]}"; do
    read -r iv m <<<"${CONFIGS[$i]}"
    "$BIN/gpuprof-sampler" --device 0 --print 600 --interval "$iv" --metrics "$m" --cupti "$L" >"$T/s$i.txt" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ "$(wc -l <"$T/s$i.txt")" -ge 2 ] && break; sleep 0.05; done
    window "c$i"
    kill -TERM $sp; wait $sp 2>/dev/null
    [ "$rep" = 1 ] && tail -n 1 "$T/s$i.txt" | cut -c1-200 | sed "s/^/  sampler $iv: /"
    window off
  done
done
touch "$T/mm_stop"; wait $MMW
echo "================ pm_overhead summary ================"
nvidia-smi -L | head -1
analysis=$($PY "$HERE/mm_windows.py" analyze "$T/mm_log" "$T/windows" "$T/gpu_log")
echo "workload: 8192x8192 ${MM_DTYPE:-bfloat16} matmuls"
grep "^off:" <<<"$analysis" | sed 's/^off:/no sampling:/'
grep "^gpu " <<<"$analysis"
for i in "${!CONFIGS[@]}"; do
  read -r iv m <<<"${CONFIGS[$i]}"
  echo "sampling every $iv, $m: $(grep "^c$i:" <<<"$analysis" | sed "s/^c$i: //")"
done
