#!/usr/bin/env bash
# Where continuous PC sampling's cost on launch-bound work comes from, and whether gpuprof adds
# to it, on a machine with an NVIDIA GPU, CUDA 13 (`nvcc`, CUPTI) and PyTorch:
#   1. CUPTI alone (pc_floor.cu): 200k small launches per process, modes alternating, REPS
#      (default 5) runs each: no CUPTI, a subscriber with gpuprof's synchronization callbacks,
#      PC sampling enabled only, and enabled + configured at periods 2^15, 2^20, 2^29; what stays
#      after an enable and a disable (endis), and after cuptiFinalize too (endisfin, cbfin)
#      (FLOOR_MODES picks modes);
#   2. gpuprof's PC sampling alone (preset pc) on the 100k-small-kernel PyTorch loop at periods
#      2^15 and 2^25 against untraced, medians of REPS;
#   3. exits while sampling: EXITS (default 10) PyTorch processes end while PC sampling is live;
#      each must exit 0, say goodbye to the daemon, and leave its last samples stored with a
#      "process exit" stop.
# PARTS (default "1 2 3") picks the parts. Prints a summary last; logs go to $OUT when set. Binaries as in pc.sh (.gpu/ or GPUPROF_BIN).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
PY=${PYTHON:-python3}
REPS=${REPS:-5}
EXITS=${EXITS:-10}
PARTS=" ${PARTS:-1 2 3} "
CUPTI=${CUPTI:-/usr/local/cuda/extras/CUPTI}
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$CUPTI/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
STATE=$(mktemp -d /tmp/gpuprof-pcfloor.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { SUMMARY+=("FIGURE $1"); echo ">>> FIGURE $1"; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
jq_py() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
DPID=
finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  [ -n "${OUT:-}" ] && mkdir -p "$OUT" && cp "$STATE/gpuprofd.log" "$OUT/pcfloor_gpuprofd.log" 2>/dev/null
  echo; echo "================ pc floor summary ================"
  nvidia-smi -L 2>/dev/null | head -1
  printf '%s\n' "${SUMMARY[@]}"
}
trap finish EXIT
trap "exit 124" TERM INT

# ---------------------------------------------------------------- 1. CUPTI alone
if [[ $PARTS == *" 1 "* ]]; then
nvcc -O2 -arch=sm_90 -I"$CUPTI/include" -o "$STATE/pc_floor" "$HERE/pc_floor.cu" -L"$CUPTI/lib64" -lcupti -lcuda \
  >"$STATE/nvcc.txt" 2>&1 || { cat "$STATE/nvcc.txt"; exit 2; }
MODES=${FLOOR_MODES:-off cb enable p15 p20 p29 endis endisfin cbfin}
declare -A F
for r in $(seq "$REPS"); do
  line="rep $r:"
  for m in $MODES; do
    o=$("$STATE/pc_floor" "$m" 200000 2>&1)
    v=$(grep -oE 'us_per_launch=[0-9.]+' <<<"$o" | cut -d= -f2)
    [ -z "$v" ] && echo "$m: $o"
    F[$m]="${F[$m]:-} $v"
    line="$line $m ${v:-?} ($(grep -oE 'samples=[0-9]+' <<<"$o")$(grep -oE ' (max_chunk|enable|configure|start|stop|read|disable|finalize|reenable)[01]?_ms=[0-9.]+' <<<"$o" | grep -v '=0.00$' | tr -d '\n'))"
  done
  echo "$line"
done
off=$(echo "${F[off]}" | median)
fl="CUPTI alone, 200k small launches, us/launch medians of $REPS: off $off"
for m in $MODES; do [ "$m" = off ] || fl="$fl, $m $(echo "${F[$m]}" | median) ($(calc "$(echo "${F[$m]}" | median) / $off")x)"; done
figure "$fl"
fi

# ---------------------------------------------------------------- gpuprofd
cat >"$STATE/cfg.toml" <<CFG
log_level = "info"
CFG
export GPUPROF_AGENT_SOCKET=$STATE/agent.sock
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
session_start() { "${CTL[@]}" --json session start "$@" | jq_py 'd["id"]'; }

# ---------------------------------------------------------------- 2. gpuprof, preset pc
if [[ $PARTS == *" 2 "* ]]; then
declare -A G
for r in $(seq "$REPS"); do
  for m in off p15 p25; do
    s=
    case $m in
      off) o=$("$PY" "$HERE/bench_torch.py" off 100000 1.5 2>&1) ;;
      *) s=$(session_start --exe python3 --preset pc --pc-sampling --pc-period "${m#p}" --name "floor-$m")
         o=$(CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/bench_torch.py" off 100000 1.5 2>&1) ;;
    esac
    [ -n "$s" ] && "${CTL[@]}" session stop "$s" >/dev/null
    G[$m]="${G[$m]:-} $(grep -oE 'per_op_us=[0-9.]+' <<<"$o" | cut -d= -f2)"
  done
  echo "rep $r torch small us/op off/p15/p25: ${G[off]##* }/${G[p15]##* }/${G[p25]##* }"
done
goff=$(echo "${G[off]}" | median); g15=$(echo "${G[p15]}" | median); g25=$(echo "${G[p25]}" | median)
figure "gpuprof preset pc, 100k small kernels us/op medians of $REPS: untraced $goff, period 2^15 $g15 ($(calc "$g15 / $goff")x), 2^25 $g25 ($(calc "$g25 / $goff")x)"
fi

# ---------------------------------------------------------------- 3. exits while sampling
[[ $PARTS == *" 3 "* ]] || exit 0
S=$(session_start --exe python3 --preset pc --pc-sampling --name exits)
bad=0
for i in $(seq "$EXITS"); do
  CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/bench_torch.py" off 50000 0.5 >"$STATE/exit_$i.txt" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { bad=$((bad + 1)); echo "exit run $i: rc $rc"; tail -3 "$STATE/exit_$i.txt"; }
done
sleep 1
"${CTL[@]}" session stop "$S" >/dev/null
pass_if "$EXITS PyTorch processes exited while PC sampling: all rc 0" "$([ $bad = 0 ] && echo 1)" "$bad failed"
closed=$(grep -c "reason=connection closed by agent" "$STATE/gpuprofd.log")
byes=$(grep -c "reason=goodbye" "$STATE/gpuprofd.log")
pass_if "every process said goodbye (none vanished)" "$([ "$closed" = 0 ] && echo 1)" "goodbye $byes, closed without goodbye $closed"
"${CTL[@]}" --json session show "$S" >"$STATE/exits.json"
stops=$(jq_py 'sum(1 for p in d.get("processes", []) for x in p.get("pc_sampling", []) if "process exit" in x.get("state", ""))' <"$STATE/exits.json")
withs=$(jq_py 'sum(1 for p in d.get("processes", []) if sum(x.get("samples", 0) for x in p.get("pc_sampling", [])) > 0)' <"$STATE/exits.json")
pass_if "each process's lease ended with a 'process exit' stop and samples" "$([ "$stops" = "$EXITS" ] && [ "$withs" = "$EXITS" ] && echo 1)" "$stops stops, $withs with samples of $EXITS"
"${CTL[@]}" session show "$S" | tail -$((EXITS + 3))
