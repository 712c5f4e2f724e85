#!/usr/bin/env bash
# GPU check of the node's always-on PC profile (`[pc] always_on = true`), on a machine with an
# NVIDIA GPU, CUDA 13 and PyTorch. No session is started by hand: gpuprofd's own profile samples
# whatever the injector is in. For SECS seconds (default 600) it alternates blocks of BLOCK
# seconds (default 30): two bf16 8192^3 matmul processes sharing one GPU (AO_GPU, default 0),
# injected ("on") or not ("off"). It prints and checks:
#   - both processes of every "on" block sampled (their samples in the profile's `session show`
#     near the block's end), and the profile's per-minute rollups answering `pc top --since`;
#   - the average cost: median ms/iter of the "on" processes against the "off" ones, <= 1 %;
#   - `pc top --since --exe` narrowing to the processes asked for.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN). Summary last; logs to $OUT when set.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=always_on
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
SECS=${SECS:-600}
BLOCK=${BLOCK:-30}
GPU=${AO_GPU:-0}
start_gpuprofd 'log_level = "info"
[pc]
always_on = true'
NODE=$("${CTL[@]}" --json session list | jq_py '[s["id"] for s in (d["sessions"] if isinstance(d, dict) else d) if s["name"] == "always-on PC profile"][0]')
echo "always-on profile: session $NODE"

ON=(); OFF=()
died=""
sampled_blocks=0; on_blocks=0; both_detail=""
t_end=$(( $(date +%s) + SECS ))
b=0
while [ "$(date +%s)" -lt "$t_end" ]; do
  b=$((b + 1))
  mode=$([ $((b % 2)) = 1 ] && echo on || echo off)
  run=$((BLOCK - 3))
  if [ $mode = on ]; then
    GPUPROF_LOG_FILE="$STATE/logs/b${b}_a.log" CUDA_VISIBLE_DEVICES=$GPU CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_a.txt" 2>&1 &
    A=$!
    GPUPROF_LOG_FILE="$STATE/logs/b${b}_b.log" CUDA_VISIBLE_DEVICES=$GPU CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_b.txt" 2>&1 &
    B=$!
    sleep $((run - 2))
    "${CTL[@]}" --json session show "$NODE" >"$STATE/b${b}_show.json" 2>&1
  else
    CUDA_VISIBLE_DEVICES=$GPU "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_a.txt" 2>&1 &
    A=$!
    CUDA_VISIBLE_DEVICES=$GPU "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_b.txt" 2>&1 &
    B=$!
  fi
  wait $A; ra=$?
  wait $B; rb=$?
  [ $ra -ge 128 ] && died="$died b${b}_a:$ra"
  [ $rb -ge 128 ] && died="$died b${b}_b:$rb"
  for f in a b; do
    v=$(grep -oE 'ms_per_iter=[0-9.]+' "$STATE/b${b}_$f.txt" | cut -d= -f2)
    [ -z "$v" ] && { echo "block $b $f:"; tail -3 "$STATE/b${b}_$f.txt"; continue; }
    if [ $mode = on ]; then ON+=("$v"); else OFF+=("$v"); fi
  done
  if [ $mode = on ]; then
    on_blocks=$((on_blocks + 1))
    got=$("$PY" - "$STATE/b${b}_show.json" "$A" "$B" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
want = {int(sys.argv[2]), int(sys.argv[3])}
n = {p["pid"]: sum(x.get("samples", 0) for x in p.get("pc_sampling", [])) for p in d.get("processes", []) if p["pid"] in want}
print(" ".join("%d:%d" % (p, n.get(p, 0)) for p in sorted(want)))
EOF
)
    both_detail="$both_detail [$got]"
    if [ "$(awk '{ok = NF == 2; for (i = 1; i <= NF; i++) { split($i, x, ":"); if (x[2] <= 0) ok = 0 } print ok}' <<<"$got")" = 1 ]; then
      sampled_blocks=$((sampled_blocks + 1))
    fi
  fi
  echo "block $b $mode: $(grep -ohE 'ms_per_iter=[0-9.]+' "$STATE/b${b}_a.txt" "$STATE/b${b}_b.txt" | tr '\n' ' ') ${got:-}"
  got=
done

"${CTL[@]}" pc top --since 15m --by line --limit 5 | tee "$STATE/top.txt"
total=$("${CTL[@]}" --json pc top --since 15m | jq_py 'd["total_samples"]')
python_only=$("${CTL[@]}" --json pc top --since 15m --exe 'python3*' | jq_py 'd["total_samples"]')
none=$("${CTL[@]}" --json pc top --since 15m --exe no-such-exe | jq_py 'd["total_samples"]')
on=$(echo "${ON[*]:-}" | median); off=$(echo "${OFF[*]:-}" | median); n_on=${#ON[@]}; n_off=${#OFF[@]}
cost=$(awk "BEGIN { printf \"%.3f\", ($on / $off - 1) * 100 }" 2>/dev/null || echo none)
figure "always-on ${SECS}s, two matmul processes on GPU $GPU, blocks of ${BLOCK}s: ms/iter median injected $on ($n_on runs) vs not $off ($n_off runs): $cost %; rollup samples $total"
pass_if "always-on: no process died" "$([ -z "$died" ] && echo 1)" "${died:-none}"
pass_if "always-on: both processes sampled in every injected block" "$([ "$on_blocks" -gt 0 ] && [ "$sampled_blocks" = "$on_blocks" ] && echo 1)" "$sampled_blocks of $on_blocks blocks:$both_detail"
pass_if "always-on: pc top --since answers from the rollups" "$([ "${total:-0}" -gt 0 ] && [ "$python_only" = "$total" ] && [ "$none" = 0 ] && echo 1)" "$total samples, --exe 'python3*' $python_only, --exe no-such-exe $none"
pass_if "always-on: average cost on matmul <= 1 %" "$([ "$n_on" -gt 0 ] && [ "$n_off" -gt 0 ] && awk "BEGIN { print $cost <= 1 ? 1 : 0 }")" "$cost %"
