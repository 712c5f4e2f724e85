#!/usr/bin/env bash
# GPU checks of detaching from CUPTI when a session stops (libgpuprof_inject.so with the real
# gpuprofd), on a machine with an NVIDIA GPU, CUDA 13 and PyTorch. The workloads are PyTorch
# processes driven line by line (tests/gpu/detach_worker.py): `small`, the 100k-small-kernel loop,
# and `conv`, a conv-net training step. Scenarios (SCENARIOS="...", default all, in this order):
#   overhead  per workload, processes untraced (none), traced by a session started before the
#             process (start), traced by a session started later (late), and late with
#             GPUPROF_DETACH=off (late_off, CUPTI left attached: the behaviour before detaching);
#             WINDOWS timed windows before the session (none, late*), while traced and after the
#             session stopped, REPS processes per mode, each pinned to the same CPUs (PIN);
#             ratios of medians against untraced processes, and for late sessions after/before
#             in the same process, from this one run.
#   cycles    one process, CYCLES attach/detach cycles stopped while it waits (each traces
#             exactly 2×1000 kernels, then 20 untraced kernels let the pending detach happen;
#             RSS, threads and fds at cycles 1, CYCLES/2, CYCLES), then BUSY cycles stopped while
#             the process launches kernels (the detach meets CUDA calls on the application's
#             thread), then torch.profiler in the same process against a process gpuprof never
#             touched.
# Prints CHECK/FIGURE lines and a summary last; logs under $OUT when set.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN), as for tests/gpu/injector.sh.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
SCENARIOS=${SCENARIOS:-overhead cycles}
REPS=${REPS:-3}
WINDOWS=${WINDOWS:-5}
CYCLES=${CYCLES:-50}
BUSY=${BUSY:-20}
# Every worker runs on these CPUs: unpinned, the same untraced loop ran at 16 or at 25 us/op
# depending on where the process landed.
PIN=${PIN:-2-5}
STATE=$(mktemp -d /tmp/gpuprof-detach.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
export GPUPROF_AGENT_SOCKET=$STATE/agent.sock GPUPROF_LOG=info
SUMMARY=()
FIGURES=()
DPID=
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { FIGURES+=("FIGURE $1"); echo ">>> FIGURE $1"; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }
jq_py() { "$PY" -c "import json,sys; v=json.load(sys.stdin); print($1)"; }

finish() {
  worker_quit
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp "$STATE/gpuprofd.log" "$OUTDIR/detach_gpuprofd.log" 2>/dev/null
    cat "$STATE"/worker_*.err >"$OUTDIR/detach_workers.log" 2>/dev/null
    cp "$STATE/windows.log" "$OUTDIR/detach_windows.log" 2>/dev/null
  fi
  echo
  echo "================ detach summary ================"
  nvidia-smi -L 2>/dev/null | head -2
  printf '%s\n' "${SUMMARY[@]}" "${FIGURES[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1)) ;; esac; done
  echo "$((${#SUMMARY[@]} - failed)) passed, $failed failed"
}
trap finish EXIT

[ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }

printf 'log_level = "info"\n[agent]\napi_from_start = true\n[sampler]\nenabled = false\n' >"$STATE/cfg.toml"
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
"${CTL[@]}" status >/dev/null 2>&1 || { echo "gpuprofd did not start"; tail -20 "$STATE/gpuprofd.log"; exit 2; }

# ---------------------------------------------------------------- helpers
# The worker: a coprocess; `ask CMD` sends a line and reads the answer into $REPLY.
WPID=
NW=0
worker_start() { # WORK [VAR=VALUE ...]
  local work=$1
  shift
  NW=$((NW + 1))
  coproc W { exec env "$@" taskset -c "$PIN" "$PY" "$HERE/detach_worker.py" "$work" 2>>"$STATE/worker_$NW.err"; }
  WPID=$W_PID
  IFS= read -r -t 120 REPLY <&"${W[0]}"
  [ "$REPLY" = ready ]
}
# A worker that died leaves W unset: every exchange then fails with REPLY="dead".
ask() { send "$1" && answer; }
send() { REPLY=dead; [ -n "${W[1]:-}" ] && echo "$1" >&"${W[1]}"; }
answer() { REPLY=dead; [ -n "${W[0]:-}" ] && IFS= read -r -t 300 REPLY <&"${W[0]}"; }
worker_alive() { [ -n "$WPID" ] && kill -0 "$WPID" 2>/dev/null; }
worker_quit() {
  if worker_alive; then
    [ -n "${W[1]:-}" ] && echo quit >&"${W[1]}" 2>/dev/null
    wait "$WPID" 2>/dev/null
  fi
  WPID=
}
session_start() { "${CTL[@]}" --json session start "$@" | jq_py 'v["id"]'; }
# The first process state of session $1 ("" when none yet).
member_state() { "${CTL[@]}" --json session show "$1" 2>/dev/null | jq_py '(v["processes"] or [{}])[0].get("state", "")' 2>/dev/null; }
member_detail() { "${CTL[@]}" --json session show "$1" 2>/dev/null | jq_py '(v["processes"] or [{}])[0].get("detail", "")' 2>/dev/null; }
wait_tracing() {
  for _ in $(seq 200); do [ "$(member_state "$1")" = tracing ] && return 0; sleep 0.05; done
  return 1
}
# Stops a session and waits until its rows are committed (ingest queue empty, kernel count
# unchanged for two looks).
session_stop() {
  "${CTL[@]}" session stop "$1" >/dev/null
  local prev=-1 cur q same=0
  for _ in $(seq 50); do
    sleep 0.1
    q=$("${CTL[@]}" --json status 2>/dev/null | jq_py 'v["ingest_queue_depth"]' 2>/dev/null)
    cur=$(kernels_of "$1")
    if [ "$q" = 0 ] && [ "$cur" = "$prev" ]; then same=$((same + 1)); else same=0; fi
    [ $same -ge 2 ] && return 0
    prev=$cur
  done
}
kernels_of() { "${CTL[@]}" --json top "$1" 2>/dev/null | jq_py 'v["kernel_count"]' 2>/dev/null; }
api_of() { "${CTL[@]}" --json top "$1" 2>/dev/null | jq_py 'sum(a["count"] for a in v.get("api_calls", []))' 2>/dev/null; }
us_of() { grep -oE 'us=[0-9.]+' <<<"$1" | cut -d= -f2; }

# ---------------------------------------------------------------- overhead
if [[ " $SCENARIOS " == *" overhead "* ]]; then
  declare -A BE TR AF WI DETAILS APIS
  for work in small conv; do
    [ $work = small ] && n=20000 || n=100
    for rep in $(seq "$REPS"); do
      for mode in none start late late_off; do
        env=()
        [ $mode != none ] && env=(CUDA_INJECTION64_PATH="$INJ")
        [ $mode = late_off ] && env+=(GPUPROF_DETACH=off)
        sid=
        [ $mode = start ] && sid=$(session_start --all --preset default --name "detach-$work-start")
        if ! worker_start $work "${env[@]}"; then
          check "overhead $work $mode: worker started" FAIL "rep $rep"
          worker_quit
          continue
        fi
        be=
        if [ $mode != start ]; then
          for _ in $(seq "$WINDOWS"); do
            ask "run $n"
            be="$be $(us_of "$REPLY")"
          done
          BE[$work.$mode]="${BE[$work.$mode]:-}$be"
        fi
        if [[ $mode == late* ]]; then
          sid=$(session_start --pid "$WPID" --preset default --name "detach-$work-$mode")
        fi
        [ -n "$sid" ] && wait_tracing "$sid"
        for _ in $(seq "$WINDOWS"); do
          ask "run $n"
          TR[$work.$mode]="${TR[$work.$mode]:-} $(us_of "$REPLY")"
        done
        if [ -n "$sid" ]; then
          session_stop "$sid"
          DETAILS[$work.$mode]="$(member_detail "$sid")"
          APIS[$work.$mode]="${APIS[$work.$mode]:-} $(api_of "$sid")"
        fi
        sleep 0.3
        af=
        for _ in $(seq "$WINDOWS"); do
          ask "run $n"
          af="$af $(us_of "$REPLY")"
        done
        AF[$work.$mode]="${AF[$work.$mode]:-}$af"
        # After the stop against before the session, in this one process.
        [ -n "$be" ] && WI[$work.$mode]="${WI[$work.$mode]:-} $(calc "$(echo "$af" | median) / $(echo "$be" | median)")"
        echo "$work $mode rep $rep: before$be | traced${TR[$work.$mode]} | after$af" >>"$STATE/windows.log"
        worker_quit
      done
    done
    t0=$(echo "${TR[$work.none]}" | median)
    a0=$(echo "${AF[$work.none]}" | median)
    figure "$work none: after/before in the same untraced process (drift):${WI[$work.none]:-}"
    for mode in start late late_off; do
      rt=$(calc "$(echo "${TR[$work.$mode]}" | median) / $t0")
      ra=$(calc "$(echo "${AF[$work.$mode]}" | median) / $a0")
      wi=$(echo "${WI[$work.$mode]:-}" | median)
      figure "$work $mode: traced ${rt}x untraced, after the stop ${ra}x untraced${wi:+, after/before in the same process ${wi}x (per process:${WI[$work.$mode]})} (untraced medians $t0 / $a0 us; API records per session:${APIS[$work.$mode]:-}; last session detail: ${DETAILS[$work.$mode]:-})"
      case $mode in
        start)
          pass_if "$work start: after the stop <= 1.02x untraced" "$(calc "$ra <= 1.02")" "${ra}x"
          ;;
        late)
          pass_if "$work late: after the stop <= 1.02x its own speed before the session" "$(calc "$wi <= 1.02")" "${wi}x; against untraced processes ${ra}x"
          pass_if "$work late: while traced <= 1.25x untraced" "$(calc "$rt <= 1.25")" "${rt}x"
          ;;
      esac
      [[ $mode == start || $mode == late ]] && pass_if "$work $mode: the session says CUPTI is detached" \
        "$([[ "${DETAILS[$work.$mode]:-}" == "detached: final"* ]] && echo 1)" "${DETAILS[$work.$mode]:-}"
    done
  done
fi

# ---------------------------------------------------------------- cycles
# One cycle: a session over the worker, wait until it traces, a command, stop, wait for rows.
cycle() { # CMD -> sets CYC_SID, CYC_KERNELS
  CYC_SID=$(session_start --pid "$WPID" --preset default --name cycle)
  wait_tracing "$CYC_SID" || echo "cycle: session $CYC_SID not tracing after 10 s" >>"$STATE/windows.log"
  ask "$1"
  session_stop "$CYC_SID"
  CYC_KERNELS=$(kernels_of "$CYC_SID")
}
# A cycle stopped while the worker launches kernels: the detach happens under CUDA calls.
busy_cycle() {
  local sid
  sid=$(session_start --pid "$WPID" --preset default --name busy)
  wait_tracing "$sid"
  send "kernels 150000"
  sleep 0.3
  session_stop "$sid"
  answer
  BUSY_DETAIL=$(member_detail "$sid")
}

if [[ " $SCENARIOS " == *" cycles "* ]]; then
  if worker_start small CUDA_INJECTION64_PATH="$INJ"; then
    exact=0
    bad=()
    stats=()
    for i in $(seq "$CYCLES"); do
      cycle "kernels 1000"
      if [ "$CYC_KERNELS" = 2000 ]; then exact=$((exact + 1)); else bad+=("$i:$CYC_KERNELS"); fi
      ask "kernels 10"
      if [ "$i" = 1 ] || [ "$i" = $((CYCLES / 2)) ] || [ "$i" = "$CYCLES" ]; then
        ask stats
        stats+=("cycle $i: ${REPLY#stats }")
      fi
      worker_alive || break
    done
    pass_if "$CYCLES attach/detach cycles in one process: every cycle traced exactly 2000 kernels" \
      "$([ $exact = "$CYCLES" ] && echo 1)" "$exact exact; off: ${bad[*]:-none}"
    fin=$(grep -c "pending detach: detached: finalized" "$STATE/worker_$NW.err")
    pass_if "cycles: each idle stop's pending detach finalized CUPTI at the next CUDA call" \
      "$([ "$fin" -ge $((CYCLES - 1)) ] && echo 1)" "$fin of $((CYCLES - 1)) seen at the next start"
    figure "cycles: ${stats[*]}"
    first=${stats[0]:-}
    last=${stats[${#stats[@]}-1]:-}
    kv() { grep -oE "$1=[0-9]+" <<<"$2" | cut -d= -f2; }
    r1=$(kv rss_kb "$first"); r2=$(kv rss_kb "$last")
    pass_if "cycles: threads and fds flat, RSS within +5 % from cycle 1 to $CYCLES" \
      "$([ "$(kv threads "$first")" = "$(kv threads "$last")" ] && [ "$(kv fds "$first")" = "$(kv fds "$last")" ] && [ "$(calc "${r2:-0} <= ${r1:-0} * 1.05")" = 1 ] && echo 1)" \
      "$first -> $last"
    ok=0
    details=()
    for i in $(seq "$BUSY"); do
      busy_cycle
      worker_alive && [[ "$REPLY" == done* ]] && ok=$((ok + 1))
      details+=("$BUSY_DETAIL")
      worker_alive || break
    done
    pass_if "$BUSY cycles stopped while the process launches kernels: no crash, no hang" \
      "$([ $ok = "$BUSY" ] && echo 1)" "$ok of $BUSY; details: $(printf '%s\n' "${details[@]}" | sort | uniq -c | tr -s ' \n' ' ')"
    ask "profile 1000"
    after=$(grep -oE 'kernels=[0-9]+' <<<"$REPLY" | cut -d= -f2)
    worker_quit
    worker_start small
    ask "profile 1000"
    fresh=$(grep -oE 'kernels=[0-9]+' <<<"$REPLY" | cut -d= -f2)
    worker_quit
    pass_if "torch.profiler after the detaches records what it records in an untouched process" \
      "$([ -n "$after" ] && [ "$after" = "$fresh" ] && [ "$after" -ge 2000 ] && echo 1)" "after gpuprof: $after, untouched: $fresh"
  else
    check "cycles: worker started" FAIL
  fi
fi

grep -iE " (warn|error) " "$STATE/gpuprofd.log" | tail -5
