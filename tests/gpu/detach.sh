#!/usr/bin/env bash
# GPU checks of detaching from CUPTI when a session stops (libgpuprof_inject.so with the real
# gpuprofd), on a machine with an NVIDIA GPU, CUDA 13 and PyTorch. The workloads are PyTorch
# processes driven line by line (tests/gpu/detach_worker.py): `small`, the 100k-small-kernel loop,
# and `conv`, a conv-net training step. Scenarios (SCENARIOS="...", default all, in this order):
#   overhead  per workload (WORKS), a process traced by a session started before it (start),
#             one traced by a session started later (late: API calls recorded by the RUNTIME
#             kind), late_hook (GPUPROF_API_HOOK=1, as gpuprofd's agent.late_attach_hook asks:
#             the runtime's API callbacks hooked inside cuInit, so the late trace records API
#             calls by callback id; its "before" windows are what the hook costs an untraced
#             process), all with GPUPROF_DETACH=finalize, and late_off (by kind with
#             GPUPROF_DETACH=off, CUPTI left attached: the behaviour before detaching),
#             late_hint (hooked as the daemon's hint asks: agent.late_attach_hook_for with the
#             worker's script name); MODES
#             picks among them. Each traced
#             process B runs beside an untraced one A, pinned to their own CPUs (PIN_A, PIN_B,
#             swapped from one rep to the next), timed windows alternating A and B: WINDOWS
#             pairs before the session (late*), while traced and after the stop, REPS reps.
#             Ratios B/A per pair, medians: wall time per op and the launching thread's CPU
#             time per op (what intercepted CUDA calls cost, without the scheduling noise of a
#             shared machine); for late sessions after the stop over before it.
#   cycles    one process (extra environment: CYCLE_ENV), CYCLES attach/detach cycles stopped while it waits (each traces
#             exactly 2×1000 kernels, then 20 untraced kernels let the pending detach happen;
#             RSS, threads and fds at cycles 1, CYCLES/2, CYCLES), then BUSY cycles stopped while
#             the process launches kernels (the detach meets CUDA calls on the application's
#             thread), then torch.profiler in the same process against a process gpuprof never
#             touched.
#   hooked_profiler  (not in the default) torch.profiler in a hooked, never traced process.
#   startup   (not in the default) what the hook costs a process's start (STARTS runs each).
# Prints CHECK/FIGURE lines and a summary last; logs under $OUT when set.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN), as for tests/gpu/injector.sh.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
SCENARIOS=${SCENARIOS:-overhead cycles}
REPS=${REPS:-2}
WINDOWS=${WINDOWS:-7}
CYCLES=${CYCLES:-50}
BUSY=${BUSY:-20}
MODES=${MODES:-start late late_hook late_off}
# Workers run pinned (unpinned, the same untraced loop ran at 16 or at 25 us/op depending on
# where the process landed), an untraced one and a traced one side by side, windows alternating,
# so that the machine's drift (an untraced process alone slowed 13-38 % over a minute) cancels.
PIN_A=${PIN_A:-2-3}
PIN_B=${PIN_B:-4-5}
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
  for w in "${!WPID[@]}"; do wquit "$w"; done
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
  # The exit status says whether every check passed (a check that failed: 1).
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT
trap "exit 143" TERM INT

[ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }

# The daemon asks the workers (by their script's name) to hook the runtime; modes other than
# late_hint set GPUPROF_API_HOOK and so decide for themselves.
printf 'log_level = "info"\n[agent]\napi_from_start = true\nlate_attach_hook_for = ["exe_pattern:*detach_worker.py*"]\n[sampler]\nenabled = false\n' >"$STATE/cfg.toml"
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
"${CTL[@]}" status >/dev/null 2>&1 || { echo "gpuprofd did not start"; tail -20 "$STATE/gpuprofd.log"; exit 2; }

# ---------------------------------------------------------------- helpers
# Workers by name, each a process reading commands from a FIFO and answering on another:
# `wstart NAME CPUS WORK [VAR=VALUE ...]`, `wask NAME CMD` (answer in $REPLY, "dead" when the
# worker died), `wsend`/`wanswer` for the two halves, `wquit NAME`.
declare -A WIN WOUT WPID
NW=0
wstart() {
  local name=$1 cpus=$2 work=$3 i o
  shift 3
  NW=$((NW + 1))
  rm -f "$STATE/$name.in" "$STATE/$name.out"
  mkfifo "$STATE/$name.in" "$STATE/$name.out"
  env "$@" taskset -c "$cpus" "$PY" "$HERE/detach_worker.py" "$work" <"$STATE/$name.in" >"$STATE/$name.out" 2>>"$STATE/worker_$NW.err" &
  WPID[$name]=$!
  exec {i}<>"$STATE/$name.in" {o}<>"$STATE/$name.out"
  WIN[$name]=$i
  WOUT[$name]=$o
  wanswer "$name"
  [ "$REPLY" = ready ]
}
walive() { [ -n "${WPID[$1]:-}" ] && kill -0 "${WPID[$1]}" 2>/dev/null; }
wsend() { REPLY=dead; walive "$1" && echo "$2" >&"${WIN[$1]}"; }
wanswer() {
  REPLY=dead
  local t
  for t in $(seq 600); do
    IFS= read -r -t 0.5 REPLY <&"${WOUT[$1]}" && return 0
    walive "$1" || { REPLY=dead; return 1; }
  done
  REPLY=dead
  return 1
}
wask() { wsend "$1" "$2" && wanswer "$1"; }
wquit() {
  [ -n "${WPID[$1]:-}" ] || return 0
  walive "$1" && echo quit >&"${WIN[$1]}"
  wait "${WPID[$1]}" 2>/dev/null
  exec {WIN[$1]}>&- {WOUT[$1]}<&-
  unset "WPID[$1]"
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
us_of() { grep -oE ' us=[0-9.]+' <<<"$1" | cut -d= -f2; }
cpu_of() { grep -oE 'cpu=[0-9.]+' <<<"$1" | cut -d= -f2; }

# ---------------------------------------------------------------- overhead
# Ratios per window pair (B over A), by "PHASE.WORK.MODE" (PHASE: before, traced, after): WALL
# from wall-clock time per op, CPU from the launching thread's CPU time per op.
declare -A WALL CPU DETAILS APIS
pair() { # KEY N
  local ta tb ca cb
  wask a "run $2"
  ta=$(us_of "$REPLY") ca=$(cpu_of "$REPLY")
  wask b "run $2"
  tb=$(us_of "$REPLY") cb=$(cpu_of "$REPLY")
  [ -n "$ta" ] && [ -n "$tb" ] && WALL[$1]+=" $(calc "$tb / $ta")" && CPU[$1]+=" $(calc "$cb / $ca")"
  echo "$1 a=$ta b=$tb cpu_a=$ca cpu_b=$cb" >>"$STATE/windows.log"
}
med() { echo "${2:-}" | median; } # NAME LIST
# "after the stop" for a mode: against untraced for start, against the same pair before the
# session for late sessions.
after_of() { # ARRAY-NAME WORK MODE
  local -n arr=$1
  local ra
  ra=$(med x "${arr[after.$2.$3]:-}")
  if [ "$3" = start ]; then echo "$ra"; else calc "$ra / $(med x "${arr[before.$2.$3]:-}")"; fi
}
if [[ " $SCENARIOS " == *" overhead "* ]]; then
  for work in ${WORKS:-small conv}; do
    [ $work = small ] && n=10000 || n=100
    for rep in $(seq "$REPS"); do
      # The two processes swap CPUs from one rep to the next; A, untraced, serves every mode.
      if [ $((rep % 2)) = 1 ]; then ca=$PIN_A cb=$PIN_B; else ca=$PIN_B cb=$PIN_A; fi
      wstart a "$ca" $work || { check "overhead $work: untraced worker started" FAIL "rep $rep"; continue; }
      for mode in $MODES; do
        env=(CUDA_INJECTION64_PATH="$INJ")
        if [ $mode = late_off ]; then env+=(GPUPROF_DETACH=off); else env+=(GPUPROF_DETACH=finalize); fi
        case $mode in late | late_off) env+=(GPUPROF_API_HOOK=0) ;; late_hook) env+=(GPUPROF_API_HOOK=1) ;; esac
        sid=
        [ $mode = start ] && sid=$(session_start --all --preset default --name "detach-$work-start")
        if ! wstart b "$cb" $work "${env[@]}"; then
          check "overhead $work $mode: worker started" FAIL "rep $rep"
          wquit b
          continue
        fi
        k=$work.$mode
        if [ $mode != start ]; then
          for _ in $(seq "$WINDOWS"); do pair "before.$k" $n; done
          sid=$(session_start --pid "${WPID[b]}" --preset default --name "detach-$work-$mode")
        fi
        wait_tracing "$sid"
        for _ in $(seq "$WINDOWS"); do pair "traced.$k" $n; done
        session_stop "$sid"
        DETAILS[$k]="$(member_detail "$sid")"
        APIS[$k]="${APIS[$k]:-} $(api_of "$sid")"
        wask b "run 1" # the first CUDA call after the stop carries out a pending detach
        sleep 0.2
        for _ in $(seq "$WINDOWS"); do pair "after.$k" $n; done
        wquit b
      done
      wquit a
    done
    for mode in $MODES; do
      k=$work.$mode
      wt=$(med x "${WALL[traced.$k]:-}") ct=$(med x "${CPU[traced.$k]:-}")
      wa=$(after_of WALL $work $mode) cpa=$(after_of CPU $work $mode)
      figure "$work $mode: traced ${wt}x (CPU ${ct}x) untraced, after the stop ${wa}x (CPU ${cpa}x) (medians of $((REPS * WINDOWS)) paired windows, traced process over untraced${WALL[before.$k]:+, after over before the session in the same pair (before: $(med x "${WALL[before.$k]}")x, CPU $(med x "${CPU[before.$k]}")x)}; API records per session:${APIS[$k]:-}; last session detail: ${DETAILS[$k]:-})"
      case $mode in
        start | late | late_hook | late_hint)
          pass_if "$work $mode: after the stop <= 1.02x untraced, launching thread's CPU time" "$(calc "$cpa <= 1.02")" "${cpa}x; wall ${wa}x"
          pass_if "$work $mode: the session says CUPTI is detached" \
            "$([[ "${DETAILS[$k]:-}" == "detached: final"* ]] && echo 1)" "${DETAILS[$k]:-}"
          ;;
        late_off)
          figure "$work: detaching takes the after-stop CPU time of a late session from ${cpa}x (off) to $(after_of CPU $work late)x"
          ;;
      esac
      [[ $mode = late_hook || $mode = late_hint ]] && pass_if "$work $mode: hooked, untraced before the session <= 1.02x untraced" \
        "$(calc "$(med x "${WALL[before.$k]:-}") <= 1.02")" "wall $(med x "${WALL[before.$k]:-}")x, CPU $(med x "${CPU[before.$k]:-}")x"
      [[ $mode = late || $mode = late_hook || $mode = late_hint ]] && pass_if "$work $mode: while traced <= 1.25x untraced" "$(calc "$wt <= 1.25")" "${wt}x wall, CPU ${ct}x; from start ${WALL[traced.$work.start]:+$(med x "${WALL[traced.$work.start]}")x}"
    done
  done
fi

# ---------------------------------------------------------------- cycles
# One cycle: a session over the worker, wait until it traces, a command, stop, wait for rows.
cycle() { # CMD -> sets CYC_SID, CYC_KERNELS
  CYC_SID=$(session_start --pid "${WPID[c]}" --preset default --name cycle)
  wait_tracing "$CYC_SID" || echo "cycle: session $CYC_SID not tracing after 10 s" >>"$STATE/windows.log"
  wask c "$1"
  session_stop "$CYC_SID"
  CYC_KERNELS=$(kernels_of "$CYC_SID")
  CYC_APIS+=" $(api_of "$CYC_SID")"
}
# A cycle stopped while the worker launches kernels: the detach happens under CUDA calls.
busy_cycle() {
  local sid
  sid=$(session_start --pid "${WPID[c]}" --preset default --name busy)
  wait_tracing "$sid"
  wsend c "kernels 150000"
  sleep 0.3
  session_stop "$sid"
  wanswer c
  BUSY_DETAIL=$(member_detail "$sid")
}

if [[ " $SCENARIOS " == *" cycles "* ]]; then
  # shellcheck disable=SC2086 # CYCLE_ENV: extra VAR=VALUE words for the cycled process
  if wstart c "$PIN_B" small CUDA_INJECTION64_PATH="$INJ" GPUPROF_DETACH=finalize GPUPROF_API_HOOK=0 ${CYCLE_ENV:-}; then
    CN=$NW
    exact=0
    bad=()
    stats=()
    for i in $(seq "$CYCLES"); do
      cycle "kernels 1000"
      if [ "$CYC_KERNELS" = 2000 ]; then exact=$((exact + 1)); else bad+=("$i:$CYC_KERNELS"); fi
      wask c "kernels 10"
      if [ "$i" = 1 ] || [ "$i" = $((CYCLES / 2)) ] || [ "$i" = "$CYCLES" ]; then
        wask c stats
        stats+=("cycle $i: ${REPLY#stats }")
      fi
      walive c || break
    done
    pass_if "$CYCLES attach/detach cycles in one process: every cycle traced exactly 2000 kernels" \
      "$([ $exact = "$CYCLES" ] && echo 1)" "$exact exact; off: ${bad[*]:-none}"
    fin=$(grep -cE "(pending at the stop is done|the last trace's pending detach): detached: finalized" "$STATE/worker_$CN.err")
    pass_if "cycles: each idle stop's pending detach finalized CUPTI at the next CUDA synchronization" \
      "$([ "$fin" -ge $((CYCLES - 1)) ] && echo 1)" "$fin of $((CYCLES - 1)) seen at the next start"
    figure "cycles: ${stats[*]}; API records per cycle:${CYC_APIS:-}"
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
      walive c && [[ "$REPLY" == done* ]] && ok=$((ok + 1))
      details+=("$BUSY_DETAIL")
      walive c || break
    done
    pass_if "$BUSY cycles stopped while the process launches kernels: no crash, no hang" \
      "$([ $ok = "$BUSY" ] && echo 1)" "$ok of $BUSY; details: $(printf '%s\n' "${details[@]}" | sort | uniq -c | tr -s ' \n' ' ')"
    wask c "profile 1000"
    after=$(grep -oE 'kernels=[0-9]+' <<<"$REPLY" | cut -d= -f2)
    wquit c
    wstart u "$PIN_B" small
    wask u "profile 1000"
    fresh=$(grep -oE 'kernels=[0-9]+' <<<"$REPLY" | cut -d= -f2)
    wquit u
    pass_if "torch.profiler after the detaches records what it records in an untouched process" \
      "$([ -n "$after" ] && [ "$after" = "$fresh" ] && [ "$after" -ge 2000 ] && echo 1)" "after gpuprof: $after, untouched: $fresh"
  else
    check "cycles: worker started" FAIL
  fi
fi

# ---------------------------------------------------------------- hooked profiler
# torch.profiler in a process whose runtime gpuprof hooked and never traced (CUPTI loaded and one
# runtime id on, no subscriber of gpuprof's) records what it records in an untouched process.
if [[ " $SCENARIOS " == *" hooked_profiler "* ]]; then
  if wstart h "$PIN_B" small CUDA_INJECTION64_PATH="$INJ" GPUPROF_API_HOOK=1 && wstart u "$PIN_A" small; then
    wask h "profile 1000"
    hooked=$(grep -oE 'kernels=[0-9]+ launches=[0-9]+' <<<"$REPLY")
    wask u "profile 1000"
    fresh=$(grep -oE 'kernels=[0-9]+ launches=[0-9]+' <<<"$REPLY")
    pass_if "torch.profiler in a hooked, never traced process records what it records in an untouched one" \
      "$([ -n "$hooked" ] && [ "$hooked" = "$fresh" ] && echo 1)" "hooked: $hooked, untouched: $fresh"
  else
    check "hooked profiler: workers started" FAIL
  fi
  wquit h
  wquit u
fi

# ---------------------------------------------------------------- startup
# What the hook costs a process's start: a PyTorch process importing torch and synchronising
# its first tensor, injected and not hooked (0) or hooked inside cuInit (1), alternating,
# STARTS each: wall time to the first synchronisation and peak RSS.
if [[ " $SCENARIOS " == *" startup "* ]]; then
  declare -A ST_S ST_KB
  for _ in $(seq "${STARTS:-5}"); do
    for h in 0 1; do
      line=$(env CUDA_INJECTION64_PATH="$INJ" GPUPROF_API_HOOK=$h "$PY" -c '
import time; t = time.time(); import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize(); t2 = time.time()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(f"s={t2 - t:.3f} kb={hwm}")' 2>>"$STATE/worker_startup.err")
      ST_S[$h]+=" $(grep -oE 's=[0-9.]+' <<<"$line" | cut -d= -f2)"
      ST_KB[$h]+=" $(grep -oE 'kb=[0-9]+' <<<"$line" | cut -d= -f2)"
    done
  done
  s0=$(med x "${ST_S[0]}") s1=$(med x "${ST_S[1]}") k0=$(med x "${ST_KB[0]}") k1=$(med x "${ST_KB[1]}")
  figure "startup (medians of ${STARTS:-5}): to the first synchronisation ${s0} s not hooked, ${s1} s hooked ($(calc "$s1 / $s0")x); peak RSS ${k0} kB, ${k1} kB (+$(calc "($k1 - $k0) / 1024") MiB)"
  pass_if "startup: the hook adds at most 10 % to the time to the first synchronisation" "$(calc "$s1 <= 1.1 * $s0")" "$s0 s -> $s1 s"
fi

grep -iE " (warn|error) " "$STATE/gpuprofd.log" | tail -5 || true
