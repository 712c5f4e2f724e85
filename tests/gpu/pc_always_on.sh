#!/usr/bin/env bash
# GPU check of the node's always-on PC profile (`[pc] always_on = true`), on a machine with an
# NVIDIA GPU, CUDA 13 and PyTorch. No session is started by hand: gpuprofd's own profile samples
# whatever the injector is in. For SECS seconds (default 600) it alternates blocks of BLOCK
# seconds (default 30): two bf16 8192^3 matmul processes sharing GPU 0, injected ("on") or not
# ("off"). It prints and checks:
#   - both processes of every "on" block sampled (their samples in the profile's `session show`
#     near the block's end), and the profile's per-minute rollups answering `pc top --since`;
#   - the average cost: median ms/iter of the "on" processes against the "off" ones, <= 1 %;
#   - `pc top --since --exe` narrowing to the processes asked for.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN). Summary last; logs to $OUT when set.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
PY=${PYTHON:-python3}
SECS=${SECS:-600}
BLOCK=${BLOCK:-30}
STATE=$(mktemp -d /tmp/gpuprof-always.XXXXXX)
mkdir -p "$STATE/logs"
export GPUPROF_LOG=${GPUPROF_LOG:-info}
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { SUMMARY+=("FIGURE $1"); echo ">>> FIGURE $1"; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
jq_py() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
DPID=
finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    (cd "$STATE" && tar czf "$OUT/always_on_logs.tgz" gpuprofd.log *.txt logs 2>/dev/null)
  fi
  echo; echo "================ always-on summary ================"
  nvidia-smi -L 2>/dev/null
  printf '%s\n' "${SUMMARY[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1));; esac; done
  echo "$failed failed"
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT

[ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }
printf 'log_level = "info"\n[pc]\nalways_on = true\n' >"$STATE/cfg.toml"
export GPUPROF_AGENT_SOCKET=$STATE/agent.sock
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
"${CTL[@]}" status >/dev/null 2>&1 || { echo "gpuprofd did not start"; cat "$STATE/gpuprofd.log"; exit 2; }
NODE=$("${CTL[@]}" --json session list | jq_py '[s["id"] for s in (d["sessions"] if isinstance(d, dict) else d) if s["name"] == "always-on PC profile"][0]')
echo "always-on profile: session $NODE"

declare -a ON OFF
sampled_blocks=0; on_blocks=0; both_detail=""
t_end=$(( $(date +%s) + SECS ))
b=0
while [ "$(date +%s)" -lt "$t_end" ]; do
  b=$((b + 1))
  mode=$([ $((b % 2)) = 1 ] && echo on || echo off)
  run=$((BLOCK - 3))
  if [ $mode = on ]; then
    GPUPROF_LOG_FILE="$STATE/logs/b${b}_a.log" CUDA_VISIBLE_DEVICES=0 CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_a.txt" 2>&1 &
    A=$!
    GPUPROF_LOG_FILE="$STATE/logs/b${b}_b.log" CUDA_VISIBLE_DEVICES=0 CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_b.txt" 2>&1 &
    B=$!
    sleep $((run - 2))
    "${CTL[@]}" --json session show "$NODE" >"$STATE/b${b}_show.json" 2>&1
  else
    CUDA_VISIBLE_DEVICES=0 "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_a.txt" 2>&1 &
    A=$!
    CUDA_VISIBLE_DEVICES=0 "$PY" "$HERE/mm.py" "$run" 1 >"$STATE/b${b}_b.txt" 2>&1 &
    B=$!
  fi
  wait $A $B
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
on=$(echo "${ON[*]}" | median); off=$(echo "${OFF[*]}" | median)
cost=$(awk "BEGIN { printf \"%.3f\", ($on / $off - 1) * 100 }")
figure "always-on ${SECS}s, two matmul processes on GPU 0, blocks of ${BLOCK}s: ms/iter median injected $on (${#ON[@]} runs) vs not $off (${#OFF[@]} runs): $cost %; rollup samples $total"
pass_if "always-on: both processes sampled in every injected block" "$([ "$on_blocks" -gt 0 ] && [ "$sampled_blocks" = "$on_blocks" ] && echo 1)" "$sampled_blocks of $on_blocks blocks:$both_detail"
pass_if "always-on: pc top --since answers from the rollups" "$([ "${total:-0}" -gt 0 ] && [ "$python_only" = "$total" ] && [ "$none" = 0 ] && echo 1)" "$total samples, --exe 'python3*' $python_only, --exe no-such-exe $none"
pass_if "always-on: average cost on matmul <= 1 %" "$(awk "BEGIN { print $cost <= 1 ? 1 : 0 }")" "$cost %"
