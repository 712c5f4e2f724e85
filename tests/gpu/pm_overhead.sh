#!/usr/bin/env bash
# What PM sampling alone costs a GPU-bound PyTorch matmul loop, by metric set and interval.
# Runs the sampler child standalone (`gpuprofd sampler --print`, no daemon, nothing stored) next
# to the loop, alternating with runs where nothing samples, and prints matmul/s medians and the
# slowdown of each configuration. Binaries as for pm_arbiter.sh (.gpu/ or GPUPROF_BIN).
set -uo pipefail
BIN=${GPUPROF_BIN:-$PWD/.gpu}
PY=${PYTHON:-python3}
L=${GPUPROF_CUPTI_LIBRARY:-/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13}
export LD_LIBRARY_PATH="$(dirname "$L"):${LD_LIBRARY_PATH:-}"
SECS=${SECS:-6}
REPS=${REPS:-3}
T=$(mktemp -d)
cat >"$T/mm.py" <<'PYEOF'
import sys, time, torch
secs = float(sys.argv[1]); n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(20): c = a @ b
torch.cuda.synchronize()
it = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize(); it += 20
print(f"{it / (time.perf_counter() - t0):.3f}")
PYEOF
FOUR=gr__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_realtime.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
NODRAM=gr__cycles_active.avg,sm__cycles_active.avg,sm__inst_executed_realtime.avg.per_cycle_active,gr__cycles_elapsed.max
ONE=sm__cycles_active.avg.pct_of_peak_sustained_elapsed
TWO=gr__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
# "INTERVAL METRICS" pairs; CONFIGS_SET=metrics compares metric counts at 1 ms instead.
if [ "${CONFIGS_SET:-}" = metrics ]; then
  CONFIGS=("1ms $ONE" "1ms $TWO" "1ms $FOUR" "1ms $NODRAM")
else
  CONFIGS=("1ms $FOUR" "1ms $NODRAM" "10ms $FOUR" "100ms $FOUR")
fi
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
run_mm() { $PY "$T/mm.py" "$SECS"; }
declare -A ON
OFF=()
for rep in $(seq "$REPS"); do
  OFF+=("$(run_mm)")
  for i in "${!CONFIGS[@]}"; do
    read -r iv m <<<"${CONFIGS[$i]}"
    "$BIN/gpuprofd" sampler --device 0 --print $((SECS + 4)) --interval "$iv" --metrics "$m" --cupti "$L" >"$T/s$i.txt" 2>&1 &
    sp=$!; sleep 2
    ON[$i]="${ON[$i]:-} $(run_mm)"
    wait $sp; tail -n 1 "$T/s$i.txt" | sed "s/^/  sampler $iv: /"
  done
done
off=$(median "${OFF[@]}")
echo "================ pm_overhead summary ================"
nvidia-smi -L | head -1
echo "no sampling: median ${off} matmul/s (runs ${OFF[*]})"
for i in "${!CONFIGS[@]}"; do
  read -r iv m <<<"${CONFIGS[$i]}"
  # shellcheck disable=SC2086
  on=$(median ${ON[$i]})
  pct=$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.3f", (a - b) / a * 100 }')
  echo "sampling every $iv, $m: median $on matmul/s, slowdown $pct % (runs${ON[$i]})"
done
