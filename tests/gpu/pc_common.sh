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
