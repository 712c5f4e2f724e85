#!/usr/bin/env bash
# GPU check of PC sampling on the jobs people run, on a machine with an NVIDIA GPU (H100/H200),
# CUDA 13 (CUPTI and its samples), PyTorch and transformers. Windows open and close at the
# process's own kernel launches, so a loop that never synchronizes is sampled. Parts (PARTS,
# default "llama small cost"):
#   llama  a transformers Llama training loop with no synchronization (llama_nosync.py):
#          sampled on a late `trace --pid P --pc-sampling --duration 10s`, from a session's
#          start, and under `[pc] always_on` beside a matmul process on the same GPU (both
#          sampled) and a process that launches nothing (not sampled);
#   small  the small-kernel loop with no synchronization (small_loop.py, SMALL_SECS s, default
#          10) untraced and in windows, SMALL_REPS (default 3) alternating runs: every run in
#          windows sampled, the median cost <= 3 %;
#   cost   the bf16 8192^3 matmul loop (mm.py, a synchronization every 10 matmuls; 1 s warm-up),
#          medians of REPS (default 5) alternating runs of COST_MODES (default "off floor win
#          cont"; pc_common.sh lists the modes) of COST_SECS (default 8) s: windows <= CUPTI's
#          sample + 1 point, continuous <= CUPTI's sample + 0.5 points; samples per second of
#          every mode beside its cost (CUPTI's sample's from its own report);
#   long   the same loop in LONG_SECS (default 60) s runs, off and windows, LONG_REPS (default 3)
#          alternating: windows <= 0.5 %; and one 30 s windowed run: the 60 s runs' samples
#          about twice the 30 s run's (1x-3x);
#   residue  the small-kernel loop's pace every half second, untraced and in windows with and
#          without the synchronization before a finalize at a launch's exit (RESIDUE_MODES,
#          default "off win winnosync"), beside the windows the injector logged;
#   contvar  one COST_SECS run of each continuous variant (CONT_MODES, default "cont contrd
#          conthw16 contsc1 contwk10 contls contp18"): where continuous's cost goes.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN). Summary last (CHECK and FIGURE lines);
# logs to $OUT when set. Exit status 1 when a check failed.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=pclaunch
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
PARTS=" ${PARTS:-llama small cost} "
REPS=${REPS:-5}
export PATH="/usr/local/cuda/bin:$PATH"
start_gpuprofd 'log_level = "info"'
cp "$HERE/mm.py" "$STATE/mm.py"
setup_modes

pid_samples() { grep -E "^$2:" <<<"$1" | cut -d: -f3 | awk '{s+=$1} END {print s+0}'; }
total_of() { "${CTL[@]}" --json pc top "$1" | jq_py 'd["total_samples"]'; }

# The samples CUPTI's sample kept in a run: its files in $STATE/pcs, read by CUPTI's
# pc_sampling_utility sample (built in place; its output kept as floor_util_N.txt); empty when
# it is not there.
UTIL_DIR=$CUPTI/samples/pc_sampling_utility
FLOOR_RUN=0
floor_samples() {
  [ -d "$UTIL_DIR" ] || return
  [ -x "$UTIL_DIR/pc_sampling_utility" ] || (cd "$UTIL_DIR" && make >"$STATE/util_make.txt" 2>&1)
  [ -x "$UTIL_DIR/pc_sampling_utility" ] || return
  local f
  FLOOR_RUN=$((FLOOR_RUN + 1))
  for f in "$STATE"/pcs/*; do
    [ -f "$f" ] || continue
    (cd "$STATE/pcs" && LD_LIBRARY_PATH="$CUPTI/lib64:${LD_LIBRARY_PATH:-}" "$UTIL_DIR/pc_sampling_utility" --file-name "$(basename "$f")" 2>&1)
  done >"$STATE/floor_util_$FLOOR_RUN.txt"
  "$PY" - "$STATE/floor_util_$FLOOR_RUN.txt" <<'EOF2'
import re, sys
t = open(sys.argv[1], errors="replace").read()
# "totalSamples N" lines when the utility prints them; else the stall counts of its PC records.
tot = [int(x) for x in re.findall(r"(?i)total\s*samples\D{0,6}(\d+)", t)]
print(sum(tot) if tot else sum(int(x) for x in re.findall(r"(?i)samples\D{0,6}(\d+)", t)))
EOF2
}

# ---------------------------------------------------------------- llama
if [[ $PARTS == *" llama "* ]]; then
  # (1) late: the loop runs with the injector in it and no session; traced 12 s in.
  GPUPROF_LOG_FILE="$STATE/logs/llama_late.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/llama_nosync.py" 28 >"$STATE/llama_late.txt" 2>&1 &
  L=$!
  # Training (the model built), and its injector connected to gpuprofd.
  for _ in $(seq 120); do grep -q ready "$STATE/llama_late.txt" && break; sleep 0.25; done
  for _ in $(seq 40); do
    "${CTL[@]}" --json procs 2>/dev/null | "$PY" -c 'import json,sys; d=json.load(sys.stdin); p=d.get("processes", d) if isinstance(d, dict) else d; sys.exit(0 if any(x.get("pid") == int(sys.argv[1]) for x in p) else 1)' "$L" && break
    sleep 0.25
  done
  sleep 2
  "${CTL[@]}" trace --pid "$L" --pc-sampling --duration 10s >"$STATE/llama_trace.txt" 2>&1
  S=$(last_session)
  "${CTL[@]}" pc top "$S" --limit 3 >"$STATE/llama_late_top.txt" 2>&1
  wait $L
  n=$(pid_samples "$(samples_of "$S")" "$L")
  echo "--- llama late: trace output"; tail -6 "$STATE/llama_trace.txt"; head -8 "$STATE/llama_late_top.txt"
  grep -E "window closed|enable:" "$STATE/logs/llama_late.log" | head -4 | cut -c1-300
  pass_if "Llama without synchronizations, late trace --pid --pc-sampling --duration 10s: sampled" \
    "$([ "$n" -gt 0 ] && echo 1)" "$n samples; $(grep -oE 'steps=[0-9]+ ms_per_step=[0-9.]+' "$STATE/llama_late.txt")"

  # (2) from the session's start.
  S=$(session_start --exe python3 --pc-sampling --name llama-start)
  GPUPROF_LOG_FILE="$STATE/logs/llama_start.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/llama_nosync.py" 15 >"$STATE/llama_start.txt" 2>&1
  "${CTL[@]}" session stop "$S" >/dev/null
  P=$(grep -oE 'LLAMA pid=[0-9]+' "$STATE/llama_start.txt" | head -1 | cut -d= -f2)
  n=$(pid_samples "$(samples_of "$S")" "${P:-x}")
  k=$("${CTL[@]}" --json session show "$S" | jq_py 'sum(p.get("kernels", 0) for p in d.get("processes", []))' 2>/dev/null)
  pass_if "Llama without synchronizations, session from its start: sampled" "$([ "$n" -gt 0 ] && echo 1)" \
    "$n samples; $(grep -oE 'steps=[0-9]+ ms_per_step=[0-9.]+' "$STATE/llama_start.txt")"
  grep -E "window closed" "$STATE/logs/llama_start.log" | head -3 | cut -c1-300

  # (3) always-on, beside a matmul process and an idle one on the same GPU.
  kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=
  rm -f "$STATE/api.sock" "$STATE/agent.sock"
  start_gpuprofd 'log_level = "info"
[pc]
always_on = true'
  NODE=$("${CTL[@]}" --json session list | jq_py '[s["id"] for s in (d["sessions"] if isinstance(d, dict) else d) if s["name"] == "always-on PC profile"][0]')
  GPUPROF_LOG_FILE="$STATE/logs/ao_llama.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/llama_nosync.py" 40 >"$STATE/ao_llama.txt" 2>&1 &
  A=$!
  GPUPROF_LOG_FILE="$STATE/logs/ao_mm.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 40 1 >"$STATE/ao_mm.txt" 2>&1 &
  B=$!
  GPUPROF_LOG_FILE="$STATE/logs/ao_idle.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/idle_cuda.py" 45 >"$STATE/ao_idle.txt" 2>&1 &
  C=$!
  # The profile's members while they run (a process that left is no member any more).
  sleep 36
  "${CTL[@]}" --json session show "$NODE" >"$STATE/ao_show.json" 2>&1
  all=$(samples_of "$NODE")
  echo "--- always-on members (pid:device:samples:state)"; echo "$all"
  wait $A $B $C
  na=$(pid_samples "$all" "$A"); nb=$(pid_samples "$all" "$B"); nc=$(pid_samples "$all" "$C")
  "${CTL[@]}" pc top "$NODE" --limit 4 >"$STATE/ao_top.txt" 2>&1; head -12 "$STATE/ao_top.txt"
  pass_if "always-on: the synchronization-free Llama and the matmul beside it both sampled, the idle process not" \
    "$([ "$na" -gt 0 ] && [ "$nb" -gt 0 ] && [ "$nc" = 0 ] && echo 1)" "Llama $na, matmul $nb, idle $nc samples"
  grep -hE "window closed" "$STATE/logs/ao_llama.log" "$STATE/logs/ao_mm.log" | cut -c1-260 | head -6
  kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=
  rm -f "$STATE/api.sock" "$STATE/agent.sock"
  start_gpuprofd 'log_level = "info"'
fi

# ---------------------------------------------------------------- small
if [[ $PARTS == *" small "* ]]; then
  declare -A SM SMS
  all_sampled=1
  for r in $(seq "${SMALL_REPS:-3}"); do
    for m in ${SMALL_MODES:-off inj win}; do
      o=$(cost_run "$m" "$PY" "$HERE/small_loop.py" "${SMALL_SECS:-10}" 1.5 2>&1)
      v=$(grep -oE 'per_op_us=[0-9.]+' <<<"$o" | cut -d= -f2); [ -z "$v" ] && { echo "small $m: $o" | tail -3; continue; }
      SM[$m]="${SM[$m]:-} $v"
      s=$(grep -oE '^SESSION [0-9]+' <<<"$o" | cut -d' ' -f2)
      if [ -n "$s" ]; then
        t=$(total_of "$s"); SMS[$m]="${SMS[$m]:-} $t"
        [ "${t:-0}" -gt 0 ] || all_sampled=0
      fi
    done
    echo "small rep $r: off ${SM[off]:-} inj ${SM[inj]:-} win ${SM[win]:-} (samples ${SMS[win]:-})"
  done
  grep -hE "window closed|enable:" "$STATE/logs/cost_win.log" 2>/dev/null | cut -c1-300 | head -6
  so=$(echo "${SM[off]:-}" | median); sw=$(echo "${SM[win]:-}" | median)
  pct=$(calc "($sw / $so - 1) * 100")
  si=$(echo "${SM[inj]:-}" | median)
  figure "small-kernel loop, no synchronization, ${SMALL_SECS:-10} s runs, us/op medians: untraced $so, injector without a session ${si:-n/a}, windows $sw ($pct %); samples per run ${SMS[win]:-}"
  pass_if "small-kernel loop without synchronizations: every windowed run sampled" "$all_sampled" "samples ${SMS[win]:-}"
  pass_if "small-kernel loop: windows cost <= 3 %" "$(awk "BEGIN { print ($pct <= 3) ? 1 : 0 }")" "$pct %"
fi

# ---------------------------------------------------------------- residue
if [[ $PARTS == *" residue "* ]]; then
  for m in ${RESIDUE_MODES:-off win winnosync}; do
    RUN_TAG=residue SMALL_CHUNKS=1 cost_run "$m" "$PY" "$HERE/small_loop.py" "${SMALL_SECS:-10}" 1.5 >"$STATE/residue_$m.txt" 2>&1
    echo "--- residue $m: us/op per half second"
    grep -oE 'utc=[0-9:.]+ per_op_us=[0-9.]+' "$STATE/residue_$m.txt" | tr '\n' ' '; echo
    grep -hE "window closed|finalized" "$STATE/logs/residue_$m.log" 2>/dev/null | cut -c1-140
    figure "residue $m: $(grep -oE 'per_op_us=[0-9.]+$' "$STATE/residue_$m.txt" | tail -1) overall"
  done
fi

# cost_loop TAG SECS REPS MODES...: the matmul loop alternating the modes; fills MM_<mode>
# (ms/iter) and MS_<mode> (samples) through the associative arrays MM and MSAMP keyed TAG:mode.
declare -A MM MSAMP
cost_loop() {
  local tag=$1 secs=$2 reps=$3 r m o v s; shift 3
  for r in $(seq "$reps"); do
    for m in "$@"; do
      rm -f "$STATE"/pcs/*.dat 2>/dev/null
      o=$(cost_run "$m" "$PY" "$STATE/mm.py" "$secs" 1 2>&1)
      v=$(grep -oE 'ms_per_iter=[0-9.]+' <<<"$o" | cut -d= -f2); [ -z "$v" ] && { echo "$tag $m: $o" | tail -3; continue; }
      MM[$tag:$m]="${MM[$tag:$m]:-} $v"
      s=$(grep -oE '^SESSION [0-9]+' <<<"$o" | cut -d' ' -f2)
      if [ -n "$s" ]; then MSAMP[$tag:$m]="${MSAMP[$tag:$m]:-} $(total_of "$s")"
      elif [ "$m" = floor ]; then MSAMP[$tag:$m]="${MSAMP[$tag:$m]:-} $(floor_samples)"; fi
    done
    local line="$tag rep $r:"; for m in "$@"; do line="$line $m ${MM[$tag:$m]:-}"; done; echo "$line"
  done
}
pct_of() { calc "($(echo "${MM[$1:$2]:-}" | median) / $(echo "${MM[$1:off]:-}" | median) - 1) * 100"; }
rate_of() { local n; n=$(echo "${MSAMP[$1:$2]:-}" | median); [ -n "$n" ] && calc "$n / ($3 + 1)" || echo n/a; }

# ---------------------------------------------------------------- cost
if [[ $PARTS == *" cost "* ]]; then
  SECS=${COST_SECS:-8}
  # shellcheck disable=SC2086
  cost_loop cost "$SECS" "$REPS" ${COST_MODES:-off floor win cont}
  line="bf16 matmul loop, $SECS s runs (+1 s warm-up), ms/iter medians of $REPS: untraced $(echo "${MM[cost:off]}" | median)"
  for m in ${COST_MODES:-off floor win cont}; do
    [ "$m" = off ] && continue
    line="$line; $m $(echo "${MM[cost:$m]:-}" | median) ($(pct_of cost "$m") %, $(rate_of cost "$m" "$SECS") samples/s)"
  done
  figure "$line"
  grep -hE "window closed|enable:" "$STATE/logs/cost_win.log" 2>/dev/null | cut -c1-300 | head -4
  if [ -n "${MM[cost:floor]:-}" ]; then
    f=$(pct_of cost floor)
    [ -n "${MM[cost:win]:-}" ] && pass_if "windows on $SECS s matmul runs <= CUPTI's sample + 1 point" \
      "$(awk "BEGIN { print ($(pct_of cost win) <= $f + 1) ? 1 : 0 }")" "$(pct_of cost win) % vs $f %"
    [ -n "${MM[cost:cont]:-}" ] && pass_if "continuous on $SECS s matmul runs <= CUPTI's sample + 0.5 points" \
      "$(awk "BEGIN { print ($(pct_of cost cont) <= $f + 0.5) ? 1 : 0 }")" "$(pct_of cost cont) % vs $f %"
  else
    check "cost against CUPTI's sample" FAIL "the pc_sampling_continuous sample did not build or run"
  fi
fi

# ---------------------------------------------------------------- contvar
if [[ $PARTS == *" contvar "* ]]; then
  SECS=${COST_SECS:-8}
  # shellcheck disable=SC2086
  cost_loop var "$SECS" 1 off ${CONT_MODES:-cont contrd conthw16 contsc1 contwk10 contls contp18} off
  line="continuous variants, $SECS s matmul runs, one each:"
  for m in ${CONT_MODES:-cont contrd conthw16 contsc1 contwk10 contls contp18}; do
    line="$line $m $(pct_of var "$m") % ($(rate_of var "$m" "$SECS") samples/s);"
  done
  figure "$line"
fi

# ---------------------------------------------------------------- long
if [[ $PARTS == *" long "* ]]; then
  LS=${LONG_SECS:-60}
  cost_loop long "$LS" "${LONG_REPS:-3}" off win
  cost_loop half 30 1 win
  w=$(pct_of long win)
  n60=$(echo "${MSAMP[long:win]:-}" | median); n30=$(echo "${MSAMP[half:win]:-}" | median)
  figure "bf16 matmul loop, $LS s runs, medians of ${LONG_REPS:-3}: untraced $(echo "${MM[long:off]}" | median), windows $(echo "${MM[long:win]}" | median) ($w %); samples: $LS s runs ${MSAMP[long:win]:-}, a 30 s run ${MSAMP[half:win]:-}"
  grep -hE "window closed" "$STATE/logs/cost_win.log" 2>/dev/null | tail -4 | cut -c1-300
  pass_if "windows on $LS s matmul runs <= 0.5 %" "$(awk "BEGIN { print ($w <= 0.5) ? 1 : 0 }")" "$w %"
  pass_if "samples of a $LS s run about twice a 30 s run's (1x-3x)" \
    "$(awk "BEGIN { r = ${n60:-0} / (${n30:-0} + 1e-9); print (r >= 1 && r <= 3) ? 1 : 0 }")" "$n60 vs $n30"
fi
