# Shared by the PC-sampling GPU scripts (pc_sched.sh, pc_always_on.sh, pc_crash.sh); sourced, not run.
# Before sourcing, set NAME (the summary's title and the log archive's name: $OUT/NAME_logs.tgz)
# and HERE. Gives: BIN, INJ, PY, STATE (a fresh directory with logs/), CTL, the CHECK/FIGURE
# summary printed at exit (exit status 1 when a check failed), helpers, and start_gpuprofd.

BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
PY=${PYTHON:-python3}
STATE=$(mktemp -d "/tmp/gpuprof-$NAME.XXXXXX")
mkdir -p "$STATE/logs"
# The injectors' logs (one file per process and part), in $OUT's archive.
export GPUPROF_LOG=${GPUPROF_LOG:-info}
# A Python process that dies by a signal prints its stacks.
export PYTHONFAULTHANDLER=1
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { SUMMARY+=("FIGURE $1"); echo ">>> FIGURE $1"; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
jq_py() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
session_start() { "${CTL[@]}" --json session start "$@" | jq_py 'd["id"]'; }
# The newest session's id (one `trace --pid` started).
last_session() { "${CTL[@]}" --json session list | jq_py 'max(s["id"] for s in (d["sessions"] if isinstance(d, dict) else d))'; }
DPID=
finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$STATE/gpuprofd.log" "$OUT/${NAME}_gpuprofd.log" 2>/dev/null
    (cd "$STATE" && tar czf "$OUT/${NAME}_logs.tgz" gpuprofd.log *.txt logs 2>/dev/null)
  fi
  echo; echo "================ $NAME summary ================"
  nvidia-smi -L 2>/dev/null
  printf '%s\n' "${SUMMARY[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1));; esac; done
  echo "$failed failed"
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT
trap "exit 124" TERM INT

# Waits (up to $2 seconds, default 60) until `procs` lists $1 processes with a rank (a torchrun
# job's ranks connect many seconds after the launcher: importing torch, NCCL set-up).
wait_ranks() {
  local n=$1 t=${2:-60} i
  for i in $(seq $((t * 2))); do
    [ "$("${CTL[@]}" --json procs 2>/dev/null | "$PY" -c 'import json,sys; d=json.load(sys.stdin); p=d.get("processes", d) if isinstance(d, dict) else d; print(sum(1 for x in p if x.get("rank") is not None))' 2>/dev/null)" = "$n" ] && return 0
    sleep 0.5
  done
  echo "wait_ranks: $n ranks did not connect within ${t}s"
  return 1
}

# Starts gpuprofd in the background with the configuration text $1; exits 2 if it does not come up.
start_gpuprofd() {
  [ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }
  printf '%s\n' "$1" >"$STATE/cfg.toml"
  export GPUPROF_AGENT_SOCKET=$STATE/agent.sock
  "$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
  "${CTL[@]}" status >/dev/null 2>&1 || { echo "gpuprofd did not start"; cat "$STATE/gpuprofd.log"; exit 2; }
}

# COST_PIN=CPUS runs every cost process on those CPUs (taskset -c), to take the scheduler's moves
# out of a CPU-bound loop's noise.
PIN=(); [ -n "${COST_PIN:-}" ] && command -v taskset >/dev/null && PIN=(taskset -c "$COST_PIN")
CUPTI=${CUPTI:-/usr/local/cuda/extras/CUPTI}

# setup_modes: builds CUPTI's own pc_sampling_continuous sample (the floor; FLOOR_LIB, empty when
# it did not build) and defines cost_run MODE COMMAND...: the command run in a mode (its output; a
# session's id last, "SESSION N"); its injector logs to logs/${RUN_TAG:-cost}_MODE.log. Modes:
#   off      untraced;              floor  CUPTI's sample injected (it writes files in $STATE/pcs);
#   inj      the injector, no session;   kern  a kernels-only session;
#   win      windows (the default);  winlow/winq  under a 0.1 / 0.25 % budget;
#   winkeep  windows keeping CUPTI attached between them (GPUPROF_PC_DETACH=0);
#   win16 / winhw512  a 16 / 512 MiB hardware buffer;  winsc  a 64 MiB scratch buffer;
#   winwk / win100wk  CUPTI's worker waking every 1 / 100 ms;  win20  20 ms windows;
#   winexit  the synchronizations' work at their exits; winnosync  no synchronization before a
#   finalize at a launch's exit (GPUPROF_PC_SYNC_FINALIZE=0); winnolines  no source lines (no
#   CUPTI call of the background thread after a window, GPUPROF_PC_LINES=0);
#   cont     continuous;  contexit  continuous, work at synchronization exits; contrd  reads at
#   most once a second; conthw16  a 16 MiB hardware buffer; contsc1  a 1 MiB scratch buffer;
#   contwk10  CUPTI's worker waking every 10 ms; contls  one stall reason (long scoreboard);
#   contp18  period 2^18 (fewer samples).
setup_modes() {
  FLOOR_LIB=
  # CUPTI's sample builds in place (its Makefile finds nvcc and CUPTI relative to the folder).
  FLOOR_DIR=$CUPTI/samples/pc_sampling_continuous
  if [ -d "$FLOOR_DIR" ]; then
    [ -e "$FLOOR_DIR/libpc_sampling_continuous.so" ] || (cd "$FLOOR_DIR" && make >"$STATE/floor_make.txt" 2>&1)
    FLOOR_LIB=$(ls "$FLOOR_DIR"/libpc_sampling_continuous.so 2>/dev/null)
    [ -z "$FLOOR_LIB" ] && tail -5 "$STATE/floor_make.txt"
    mkdir -p "$STATE/pcs"
  fi
}
cost_run() {
  local mode=$1; shift
  set -- "${PIN[@]}" "$@"
  local s= sess=() env=() pc=(--preset pc --pc-sampling) cont=(--preset pc --pc-sampling --pc-mode continuous)
  case $mode in
    off) "$@"; return ;;
    floor) (cd "$STATE/pcs" && LD_LIBRARY_PATH="$CUPTI/lib64:$FLOOR_DIR:${LD_LIBRARY_PATH:-}" CUDA_INJECTION64_PATH="$FLOOR_LIB" "$@"); return ;;
    inj) ;;
    kern) sess=(--preset kernels) ;;
    win) sess=("${pc[@]}") ;;
    winlow) sess=("${pc[@]}" --pc-budget 0.1) ;;
    winq) sess=("${pc[@]}" --pc-budget 0.25) ;;
    winkeep) sess=("${pc[@]}"); env=(GPUPROF_PC_DETACH=0) ;;
    win16) sess=("${pc[@]}"); env=(GPUPROF_PC_HW_MIB=16) ;;
    winhw512) sess=("${pc[@]}"); env=(GPUPROF_PC_HW_MIB=512) ;;
    winsc) sess=("${pc[@]}"); env=(GPUPROF_PC_SCRATCH_MIB=64) ;;
    winwk) sess=("${pc[@]}"); env=(GPUPROF_PC_WORKER_MS=1) ;;
    win100wk) sess=("${pc[@]}"); env=(GPUPROF_PC_WORKER_MS=0) ;;
    win20) sess=("${pc[@]}"); env=(GPUPROF_PC_WINDOW_MS=20) ;;
    winexit) sess=("${pc[@]}"); env=(GPUPROF_PC_AT=exit) ;;
    winnosync) sess=("${pc[@]}"); env=(GPUPROF_PC_SYNC_FINALIZE=0) ;;
    winnolines) sess=("${pc[@]}"); env=(GPUPROF_PC_LINES=0) ;;
    cont) sess=("${cont[@]}") ;;
    contexit) sess=("${cont[@]}"); env=(GPUPROF_PC_AT=exit) ;;
    contrd) sess=("${cont[@]}"); env=(GPUPROF_PC_READ_MS=1000) ;;
    conthw16) sess=("${cont[@]}"); env=(GPUPROF_PC_HW_MIB=16) ;;
    contsc1) sess=("${cont[@]}"); env=(GPUPROF_PC_SCRATCH_MIB=1) ;;
    contwk10) sess=("${cont[@]}"); env=(GPUPROF_PC_WORKER_MS=10) ;;
    contls) sess=("${cont[@]}" --pc-stall stalled_long_scoreboard) ;;
    contp18) sess=("${cont[@]}" --pc-period 18) ;;
    *) echo "unknown cost mode $mode"; return ;;
  esac
  [ ${#sess[@]} -gt 0 ] && s=$(session_start --exe python3 "${sess[@]}" --name "${RUN_TAG:-cost}-$mode")
  env "${env[@]}" GPUPROF_LOG_FILE="$STATE/logs/${RUN_TAG:-cost}_$mode.log" CUDA_INJECTION64_PATH="$INJ" "$@"
  [ -n "$s" ] && "${CTL[@]}" session stop "$s" >/dev/null && echo "SESSION $s"
}

# Samples per (pid, device) of a session, "pid:device:samples:state" lines.
samples_of() {
  "${CTL[@]}" --json session show "$1" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
for p in d.get("processes", []):
    for x in p.get("pc_sampling", []):
        print("%s:%s:%s:%s" % (p["pid"], x["device"], x.get("samples", 0), x.get("state", "")))'
}
