#!/usr/bin/env bash
# GPU check of PC sampling on real jobs, on a machine with NVIDIA GPUs (H100/H200; 2 or more for
# the DDP part), CUDA 13 (`nvcc`, CUPTI and its samples) and PyTorch:
#   ddp    torchrun DDP over every GPU under `session start --all --pc-sampling`: every rank gets
#          samples on its own GPU and none elsewhere, the launcher none (and says why);
#   ddptrace  a running DDP job with the injector in it, traced by its launcher's pid
#          (`trace --pid L --pc-sampling --duration 10s`): every rank sampled, the hottest kernel;
#   share  two matmul processes on GPU 0 in one session: both get samples, within 3:1 of each
#          other (equal work), and `pc top` says who waits for its turn;
#   late   `gpuprofctl trace --pid P --pc-sampling --duration 6s` on a running -lineinfo CUDA C
#          program: the hottest line is gather's dependent load (pc_kernel.cu:15), the pprof
#          export names the file; then the same on a second run of the program, whose cubin
#          comes from gpuprofd's cache (the first run sent it) without reading any file;
#          LATE_SECS (default 14) is how long each run of the program lasts (attached at 3 s);
#   cost   medians of REPS (default 5) alternating runs of COST_MODES (pc_common.sh's cost_run
#          lists them; default: untraced, CUPTI's own pc_sampling_continuous sample (the floor),
#          gpuprof windows, gpuprof continuous) on a bf16 8192^3 matmul loop and on a loop of
#          small PyTorch kernels with a synchronization every 100 (small_sync.py);
#          COST_MM_SECS=0 or COST_SMALL_N=0 leaves that loop out. COST_WARM=S runs each loop
#          untimed first (the matmul loop S s, default 1; the small loop S x 100k ops, default
#          none). COST_CLOCKS=1 samples the SM clock and power during each matmul run
#          (nvidia-smi every 100 ms) and prints their medians per mode. COST_PIN=CPUS pins every
#          cost and residue process to those CPUs (taskset -c).
#   residue  where the windows' cost goes on launch-bound work: the small-kernel loop
#          (RESIDUE_N ops, default 1.5M) untraced, in windows (the default) and in windows
#          keeping CUPTI attached (winkeep, GPUPROF_PC_DETACH=0; RESIDUE_MODES picks modes), its pace printed per 50k ops beside the windows the injector
#          logged (before the first window, inside, after a disable).
#   yield  the samples each window keeps on the matmul loop synchronizing after every 1, 10 and
#          100 matmuls (YIELD_BATCH), in each of YIELD_MODES (cost modes; default "win
#          winwk"), from the injector's log: 3 s runs.
#   pair   (2 GPUs) the small-kernel loop in each of PAIR_MODES (default "off win") beside an
#          untraced twin run at the same time on the other GPU and CPUs (PAIR_CPUS_A/B, default
#          4-7 and 8-11; swapped every rep) and GPUs (PAIR_GPUS, default "0 1": two runs of
#          this script on other GPUs and CPUs measure two mode sets at once): the median of REPS
#          ratios, which the machine's phases of slower pace (untraced too) cancel out of;
#          PAIR_N ops (2.5M, 40-50 s on the H200 machines: long enough for the windows' steady
#          state, 25-40 s apart, and to average the phases out) after COST_WARM; PAIR_SECS (unset:
#          none) stops before a rep that would end after it, so that a run with a time limit
#          still prints its figures.
# DDP_PC_MODE=continuous samples the DDP part continuously instead of in windows.
# PARTS (default "ddp ddptrace share late cost"; also "probe", "residue", "yield" and "pair"; probe: one PC-only session with the injector's
# debug log) picks the parts; DDP_LOG=debug logs the DDP processes' synchronizations too. It prints a summary last (CHECK and
# FIGURE lines) and copies logs to $OUT when set. Exit status 1 when a check failed.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN), as in pc.sh.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=pcsched
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
REPS=${REPS:-5}
PARTS=" ${PARTS:-ddp ddptrace share late cost} "
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start_gpuprofd 'log_level = "info"'
NGPU=$(nvidia-smi -L | grep -c '^GPU')

cp "$HERE/mm.py" "$STATE/mm.py"


# ---------------------------------------------------------------- probe
# One PC-only session on the matmul loop with the injector's debug log: what it reports.
if [[ $PARTS == *" probe "* ]]; then
  S=$(session_start --exe python3 --preset pc --pc-sampling --name probe)
  GPUPROF_LOG=debug GPUPROF_LOG_FILE="$STATE/logs/probe.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 4 1 >"$STATE/probe.txt" 2>&1
  "${CTL[@]}" session stop "$S" >/dev/null
  echo "--- probe"; grep -E "activity|synchroniz|subscriber|enable|window|Stopped|Sampling" "$STATE/logs/probe.log" | head -20
  samples_of "$S"
fi

# ---------------------------------------------------------------- ddp
if [[ $PARTS == *" ddp "* ]]; then
  S=$(session_start --all --pc-sampling ${DDP_PC_MODE:+--pc-mode $DDP_PC_MODE} --name ddp)
  GPUPROF_LOG=${DDP_LOG:-info} GPUPROF_LOG_FILE="$STATE/logs/ddp.log" CUDA_INJECTION64_PATH="$INJ" "$PY" -m torch.distributed.run --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" 10 \
    >"$STATE/ddp.txt" 2>&1 &
  LPID=$!
  wait_ranks "$NGPU" 60
  sleep 3
  "${CTL[@]}" session show "$S" >"$STATE/ddp_show_live.txt" 2>&1
  "${CTL[@]}" pc top "$S" --limit 3 >"$STATE/ddp_top_live.txt" 2>&1
  wait $LPID
  "${CTL[@]}" session stop "$S" >/dev/null
  sleep 1
  echo "--- ddp"; grep -E '^DDP|Error|error' "$STATE/ddp.txt" | head -8
  # What each process's PC sampler did (DDP_LOG=debug adds its synchronizations by context).
  grep -E "enable:|window closed|Stopped|starts once|synchronizations by" "$STATE/logs/ddp.log" | head -30
  echo "--- session show (live)"; tail -20 "$STATE/ddp_show_live.txt"
  echo "--- pc top (live)"; head -12 "$STATE/ddp_top_live.txt"
  samples_of "$S" | tee "$STATE/ddp_samples.txt"
  ranks=$(grep -oE 'DDP rank=[0-9]+ local_rank=[0-9]+' "$STATE/ddp.txt" | wc -l)
  ok=1; detail=""
  for r in $(seq 0 $((NGPU - 1))); do
    rpid=$(grep -oE "RANKPID rank=$r pid=[0-9]+" "$STATE/ddp.txt" | grep -oE '[0-9]+$')
    own=$(grep -E "^${rpid}:${r}:" "$STATE/ddp_samples.txt" | cut -d: -f3)
    other=$(grep -E "^${rpid}:" "$STATE/ddp_samples.txt" | grep -vE "^${rpid}:${r}:" | cut -d: -f3 | awk '{s+=$1} END {print s+0}')
    detail="$detail rank $r (pid $rpid): ${own:-0} on GPU $r, $other elsewhere;"
    [ "${own:-0}" -gt 0 ] && [ "$other" = 0 ] || ok=0
  done
  lsamples=$(grep -E "^${LPID}:" "$STATE/ddp_samples.txt" | cut -d: -f3 | awk '{s+=$1} END {print s+0}')
  lstate=$(grep -E "^${LPID}:" "$STATE/ddp_samples.txt" | head -1 | cut -d: -f4-)
  pass_if "DDP on $NGPU GPUs: every rank sampled on its own GPU only" "$([ "$ranks" = "$NGPU" ] && [ $ok = 1 ] && echo 1)" "$detail"
  pass_if "DDP: the launcher (pid $LPID) gets no samples" "$([ "$lsamples" = 0 ] && grep -qE "^${LPID}:" "$STATE/ddp_samples.txt" && echo 1)" "$lsamples samples; $lstate"
  pass_if "DDP: pc top says why the launcher is not sampled" "$(grep -q "pid $LPID (launcher) device .*not sampled" "$STATE/ddp_top_live.txt" && echo 1)" "$(grep "pid $LPID" "$STATE/ddp_top_live.txt" | head -1)"
fi

# ---------------------------------------------------------------- ddptrace
# A running DDP job (the injector in it, no session) traced afterwards by its launcher's pid:
# `trace --pid LAUNCHER --pc-sampling --duration 10s` covers the ranks it started.
if [[ $PARTS == *" ddptrace "* ]]; then
  GPUPROF_LOG_FILE="$STATE/logs/ddptrace.log" CUDA_INJECTION64_PATH="$INJ" "$PY" -m torch.distributed.run --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" 25 \
    >"$STATE/ddptrace.txt" 2>&1 &
  LPID=$!
  # Running: every rank past its first step (starting up takes the ranks 5-12 s).
  for _ in $(seq 120); do [ "$(grep -c '^TRAINING rank=' "$STATE/ddptrace.txt")" -ge "$NGPU" ] && break; sleep 0.5; done
  sleep 1
  "${CTL[@]}" trace --pid "$LPID" --pc-sampling --duration 10s >"$STATE/ddptrace_trace.txt" 2>&1
  S=$(last_session)
  wait $LPID
  echo "--- ddp traced by the launcher's pid"; tail -25 "$STATE/ddptrace_trace.txt"
  "${CTL[@]}" pc top "$S" --by line --limit 5 | tee "$STATE/ddptrace_top.txt"
  samples_of "$S" | tee "$STATE/ddptrace_samples.txt"
  ok=1; detail=""
  for r in $(seq 0 $((NGPU - 1))); do
    rpid=$(grep -oE "RANKPID rank=$r pid=[0-9]+" "$STATE/ddptrace.txt" | grep -oE '[0-9]+$')
    own=$(grep -E "^${rpid}:${r}:" "$STATE/ddptrace_samples.txt" | cut -d: -f3)
    detail="$detail rank $r (pid $rpid): ${own:-0};"
    [ "${own:-0}" -gt 0 ] || ok=0
  done
  pass_if "trace --pid of a running DDP job's launcher: every rank sampled" "$ok" "$detail"
  stall=$("${CTL[@]}" --json pc top "$S" --by line --limit 1 | jq_py '"%s | %s:%d | %s" % (d["rows"][0]["function"][:60], d["rows"][0]["file"], d["rows"][0]["line"], d["rows"][0]["stalls"][0]["reason"]) if d["rows"] else "none"')
  pass_if "trace --pid of a running DDP job: the hottest kernel with its stall reason" "$([ "$stall" != none ] && echo 1)" "$stall"
fi

# ---------------------------------------------------------------- share
if [[ $PARTS == *" share "* ]]; then
  S=$(session_start --exe python3 --pc-sampling --name share)
  GPUPROF_LOG_FILE="$STATE/logs/share_a.log" CUDA_VISIBLE_DEVICES=0 CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 12 1 >"$STATE/share_a.txt" 2>&1 &
  A=$!
  GPUPROF_LOG_FILE="$STATE/logs/share_b.log" CUDA_VISIBLE_DEVICES=0 CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 12 1 >"$STATE/share_b.txt" 2>&1 &
  B=$!
  sleep 8
  "${CTL[@]}" pc top "$S" --limit 2 >"$STATE/share_top_live.txt" 2>&1
  wait $A $B
  "${CTL[@]}" session stop "$S" >/dev/null
  sleep 1
  echo "--- share"; cat "$STATE/share_a.txt" "$STATE/share_b.txt" | grep MM; head -8 "$STATE/share_top_live.txt"
  samples_of "$S" | tee "$STATE/share_samples.txt"
  sa=$(grep -E "^$A:" "$STATE/share_samples.txt" | cut -d: -f3 | awk '{s+=$1} END {print s+0}')
  sb=$(grep -E "^$B:" "$STATE/share_samples.txt" | cut -d: -f3 | awk '{s+=$1} END {print s+0}')
  pass_if "two processes sharing GPU 0 both sampled, within 3:1 (equal work)" \
    "$(awk "BEGIN { print ($sa > 0 && $sb > 0 && $sa / $sb <= 3 && $sb / $sa <= 3) ? 1 : 0 }")" "$sa vs $sb samples"
  pass_if "pc top shows the one waiting for its turn" "$(grep -q 'waiting for its turn' "$STATE/share_top_live.txt" && echo 1)" \
    "$(grep -m1 'waiting' "$STATE/share_top_live.txt")"
fi

# ---------------------------------------------------------------- late
if [[ $PARTS == *" late "* ]]; then
  nvcc -O2 -lineinfo -arch=sm_90 -o "$STATE/pc_kernel" "$HERE/pc_kernel.cu" >"$STATE/nvcc.txt" 2>&1 || cat "$STATE/nvcc.txt"
  # late_attach TAG: a run of the program attached 3 s after its start; checks its hottest line.
  late_attach() {
    local tag=$1
    CUDA_INJECTION64_PATH="$INJ" GPUPROF_LOG=info GPUPROF_LOG_FILE="$STATE/logs/${tag}_inj.txt" "$STATE/pc_kernel" "${LATE_SECS:-14}" 0 \
      >"$STATE/${tag}_kernel.txt" 2>&1 &
    local k=$!
    sleep 3
    "${CTL[@]}" trace --pid "$k" --pc-sampling --duration 6s >"$STATE/${tag}_trace.txt" 2>&1
    S=$(last_session)
    wait $k
    echo "--- $tag attach"; tail -12 "$STATE/${tag}_trace.txt"
    "${CTL[@]}" pc top "$S" --by line --limit 4 | tee "$STATE/${tag}_top.txt"
    top_line=$("${CTL[@]}" --json pc top "$S" --by line --limit 1 | jq_py '"%s:%d %s" % (d["rows"][0]["file"].split("/")[-1], d["rows"][0]["line"], d["rows"][0]["function"]) if d["rows"] else "none"')
    pass_if "$tag attach: the hottest line is gather's dependent load (pc_kernel.cu:15)" "$(grep -q '^pc_kernel.cu:15 gather' <<<"$top_line" && echo 1)" "$top_line"
    grep -hE "mapped files|modules loaded before" "$STATE/logs/${tag}_inj.txt" 2>/dev/null | head -3
  }
  late_attach late
  "${CTL[@]}" export "$S" --format pprof -o "$STATE/late.pb.gz" >/dev/null 2>&1
  pass_if "late attach: the pprof export names the file" "$(zcat "$STATE/late.pb.gz" 2>/dev/null | grep -aq 'pc_kernel.cu' && echo 1)" "$(stat -c %s "$STATE/late.pb.gz" 2>/dev/null) bytes"
  # The second run gets the cubin the first found from gpuprofd, without reading its files.
  late_attach late2
  had=$(grep -ohE "gpuprofd had the cubins of [0-9]+ modules" "$STATE/logs/late2_inj.txt" | head -1)
  looked=$(grep -c "looking for the cubins of modules loaded before sampling in the mapped files" "$STATE/logs/late2_inj.txt")
  pass_if "second late attach: the cubin came from gpuprofd's cache, no file read" \
    "$([ "$had" = "gpuprofd had the cubins of 1 modules" ] && [ "$looked" = 0 ] && echo 1)" "${had:-no answer}; looked in the files $looked times"
fi

# ---------------------------------------------------------------- the modes (cost, residue, yield, pair)
if [[ $PARTS == *" cost "* || $PARTS == *" pair "* || $PARTS == *" yield "* || $PARTS == *" residue "* ]]; then
  setup_modes
fi
# ---------------------------------------------------------------- residue
if [[ $PARTS == *" residue "* ]]; then
  for mode in ${RESIDUE_MODES:-off win winkeep}; do
    RUN_TAG=residue cost_run "$mode" "$PY" "$HERE/small_sync.py" "${RESIDUE_N:-1500000}" 1.5 50000 >"$STATE/residue_$mode.txt" 2>&1
    echo "--- residue $mode: us/op per 50k ops (utc: end of the chunk)"
    grep -oE 'utc=[0-9:.]+ at_s=[0-9.]+ per_op_us=[0-9.]+' "$STATE/residue_$mode.txt"
    grep -h "enable:\|window closed\|finalized" "$STATE/logs/residue_$mode.log" 2>/dev/null | cut -c1-200 | head -12
    figure "residue $mode: $(grep -oE 'per_op_us=[0-9.]+$' "$STATE/residue_$mode.txt" | tail -1) overall"
  done
fi

# ---------------------------------------------------------------- cost
if [[ $PARTS == *" cost "* ]]; then
  MODES=${COST_MODES:-off win cont}
  [ -n "$FLOOR_LIB" ] && [ -z "${COST_MODES:-}" ] && MODES="off floor win cont"
  declare -A MM SM MMS SMS
  for r in $(seq "$REPS"); do
    for mode in $MODES; do
      if [ "${COST_MM_SECS:-4}" != 0 ]; then
      [ "${COST_CLOCKS:-0}" = 1 ] && { nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 >"$STATE/clk_${mode}_$r.txt" 2>/dev/null & CLK=$!; }
      o=$(cost_run $mode "$PY" "$STATE/mm.py" "${COST_MM_SECS:-4}" "${COST_WARM:-1}" 2>&1)
      [ "${COST_CLOCKS:-0}" = 1 ] && kill "$CLK" 2>/dev/null && wait "$CLK" 2>/dev/null
      v=$(grep -oE 'ms_per_iter=[0-9.]+' <<<"$o" | cut -d= -f2); [ -z "$v" ] && echo "$mode mm: $o" | tail -3
      [ "$mode" = win ] && WT="${WT:-} $(grep -oE 'pid=[0-9]+ timed_from=[0-9:.]+' <<<"$o" | sed 's/pid=//; s/ timed_from=/@/')"
      MM[$mode]="${MM[$mode]:-} $v"
      s=$(grep -oE '^SESSION [0-9]+' <<<"$o" | cut -d' ' -f2)
      [ -n "$s" ] && MMS[$mode]="${MMS[$mode]:-} $("${CTL[@]}" --json pc top "$s" | jq_py 'd["total_samples"]')"
      fi
      [ "${COST_SMALL_N:-250000}" = 0 ] && continue
      o=$(cost_run $mode "$PY" "$HERE/small_sync.py" "${COST_SMALL_N:-250000}" 1.5 0 "$(awk "BEGIN { print int(${COST_WARM:-0} * 100000) }")" 2>&1)
      v=$(grep -oE 'per_op_us=[0-9.]+' <<<"$o" | cut -d= -f2); [ -z "$v" ] && echo "$mode small: $o" | tail -3
      SM[$mode]="${SM[$mode]:-} $v"
      s=$(grep -oE '^SESSION [0-9]+' <<<"$o" | cut -d' ' -f2)
      [ -n "$s" ] && SMS[$mode]="${SMS[$mode]:-} $("${CTL[@]}" --json pc top "$s" | jq_py 'd["total_samples"]')"
    done
    line="rep $r:"; for m in $MODES; do line="$line $m ${MM[$m]:-}ms/${SM[$m]:-}us"; done; echo "$line"
  done
  for m in win; do
    [ -e "$STATE/logs/cost_$m.log" ] && { echo "--- $m: the first windows"; grep -h "enable:\|window closed" "$STATE/logs/cost_$m.log" | head -6; }
  done
  # CUPTI's one-time set-up in each process (its first cuptiPCSamplingEnable and first range's
  # start), paid whatever the budget: beside a run's length it is the floor of a short run.
  if [ -e "$STATE/logs/cost_win.log" ]; then
    first=$(grep -h "PC sampling enable:" "$STATE/logs/cost_win.log" | awk '!seen[$1]++ {
      match($0, /cuptiPCSamplingEnable [0-9.]+/); e = substr($0, RSTART + 22, RLENGTH - 22)
      match($0, /start [0-9.]+/); s = substr($0, RSTART + 6, RLENGTH - 6); print e + s }' | median)
    [ -n "$first" ] && figure "win: a process's first enable and start (CUPTI's one-time set-up) median $first ms: $(calc "$first / (${COST_MM_SECS:-4} * 10)") % of a ${COST_MM_SECS:-4} s matmul run (timed after ${COST_WARM:-1} s untimed)"
  fi
  # The SM clock and power while the matmul ran (samples over 300 W), per mode.
  if [ "${COST_CLOCKS:-0}" = 1 ]; then
    for m in $MODES; do
      c=$(cat "$STATE"/clk_"${m}"_*.txt 2>/dev/null | awk -F', ' '$2 > 300 { print $1 }' | median)
      w=$(cat "$STATE"/clk_"${m}"_*.txt 2>/dev/null | awk -F', ' '$2 > 300 { print $2 }' | median)
      figure "$m: SM clock median $c MHz at $w W while the matmul ran"
    done
  fi
  # Whether that set-up fell in the untimed warm-up (each process's first enable logged before its
  # timed part began): then the matmul figures below are the steady state.
  if [ -n "${WT:-}" ] && [ -e "$STATE/logs/cost_win.log" ]; then
    early=0; n=0
    for pt in $WT; do
      n=$((n + 1))
      e=$(grep -h "^gpuprof-inject\[${pt%@*}\] .*PC sampling enable:" "$STATE/logs/cost_win.log" | head -1 | awk '{ print $2 }')
      [ -n "$e" ] && [[ "$e" < "${pt#*@}" ]] && early=$((early + 1))
    done
    figure "win: the first enable fell in the untimed warm-up in $early of $n matmul processes"
  fi
  mo=$(echo "${MM[off]:-}" | median); so=$(echo "${SM[off]:-}" | median)
  [ "${COST_MM_SECS:-4}" = 0 ] && mo=; [ "${COST_SMALL_N:-250000}" = 0 ] && so=
  fl="bf16 matmul ms/iter medians of $REPS: untraced $mo"; fs="small-kernel loop (${COST_SMALL_N:-250000} ops, a synchronization every 100) us/op medians of $REPS: untraced $so"
  for m in $MODES; do
    [ "$m" = off ] && continue
    mm=$(echo "${MM[$m]:-}" | median); sm=$(echo "${SM[$m]:-}" | median)
    [ -n "$mo" ] && fl="$fl, $m $mm ($(calc "($mm / $mo - 1) * 100") %; samples ${MMS[$m]:-n/a})"
    [ -n "$so" ] && fs="$fs, $m $sm ($(calc "($sm / $so - 1) * 100") %; samples ${SMS[$m]:-n/a})"
  done
  [ -n "$mo" ] && figure "$fl (${COST_MM_SECS:-4} s runs)"; [ -n "$so" ] && figure "$fs"
  pct() { awk "BEGIN { printf \"%.3f\", ($(echo "$1" | median) / $2 - 1) * 100 }"; }
  [ -n "$mo" ] && [ -n "${MM[win]:-}" ] && pass_if "windows (default) on the matmul loop <= 0.5 %" "$(awk "BEGIN { print $(pct "${MM[win]}" "$mo") <= 0.5 ? 1 : 0 }")" "$(pct "${MM[win]}" "$mo") %"
  [ -n "$so" ] && [ -n "${SM[win]:-}" ] && pass_if "windows (default) on the small-kernel loop <= 3 %" "$(awk "BEGIN { print $(pct "${SM[win]}" "$so") <= 3 ? 1 : 0 }")" "$(pct "${SM[win]}" "$so") %"
  if [ -n "$FLOOR_LIB" ] && [ -n "$mo" ] && [ -n "${MM[cont]:-}" ]; then
    pass_if "continuous on the matmul loop <= CUPTI's sample + 0.5 points" \
      "$(awk "BEGIN { print $(pct "${MM[cont]}" "$mo") <= $(pct "${MM[floor]:-}" "$mo") + 0.5 ? 1 : 0 }")" \
      "$(pct "${MM[cont]}" "$mo") % vs $(pct "${MM[floor]:-}" "$mo") %"
  elif [ -z "$FLOOR_LIB" ]; then
    check "continuous vs CUPTI's sample" FAIL "the pc_sampling_continuous sample did not build"
  fi
fi

# ---------------------------------------------------------------- yield
# The samples each window keeps on the matmul loop, by how the windows are made (YIELD_MODES, cost
# modes' names) and how often the loop synchronizes
# (YIELD_BATCH: a synchronization after every N matmuls; 3 s runs, no warm-up).
if [[ $PARTS == *" yield "* ]]; then
  for m in ${YIELD_MODES:-win winwk}; do
    for b in ${YIELD_BATCH:-1 10 100}; do
      o=$(cost_run "$m" "$PY" "$STATE/mm.py" 3 0 8192 "$b" 2>&1)
      pid=$(grep -oE 'MM pid=[0-9]+ ms_per' <<<"$o" | grep -oE '[0-9]+')
      w=$(grep -h "^gpuprof-inject\[${pid:-x}\] .*window closed" "$STATE/logs/cost_$m.log" 2>/dev/null |
        sed -E 's/.*closed after ([0-9.]+) ms.* ([0-9]+) samples.*/\1ms:\2/' | tr '\n' ' ')
      s=$(grep -oE '^SESSION [0-9]+' <<<"$o" | cut -d' ' -f2)
      t=$([ -n "$s" ] && "${CTL[@]}" --json pc top "$s" | jq_py 'd["total_samples"]')
      figure "yield $m, a synchronization every $b matmuls: ${t:-no} samples in the session; windows (length:samples) ${w:-none}"
    done
  done
fi

# ---------------------------------------------------------------- pair
# What the windows of the newest process in the injector log $1 cost it by their own account, in
# % of its timed $3 s: the time of PC-sampling calls on its threads (the exit line's total), and
# for each window its length times the share of launches it lost against the untraced twin's
# pace ($2 us per kernel), but for the first window (at the start, untimed). Empty when the
# log says nothing.
pair_estimate() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import re, sys
path, twin_us, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3] or 0)
lines = open(path, errors="replace").read().splitlines()
pids = [m.group(1) for l in lines for m in [re.match(r"gpuprof-inject\[(\d+)\]", l)] if m]
if not pids or secs <= 0:
    sys.exit()
mine = [l for l in lines if l.startswith(f"gpuprof-inject[{pids[-1]}]")]
calls = 0.0
for l in mine:
    m = re.search(r"windows, ([0-9.]+) ms in PC-sampling calls", l)
    if m:
        calls = float(m.group(1))
# The first window opens at the process's start, before the timed part (its enable, close and
# lost launches are left out).
first = True
lost = 0.0
for l in mine:
    m = re.search(r"cuptiPCSamplingEnable ([0-9.]+) ms", l)
    if m and first:
        calls -= float(m.group(1))
    m = re.search(r"window closed after ([0-9.]+) ms: stop(?: and disable)? ([0-9.]+) ms.* ([0-9]+) launches/s", l)
    if m:
        if first:
            calls -= float(m.group(2))
            first = False
            continue
        length, rate = float(m.group(1)), float(m.group(3))
        lost += length * max(0.0, 1.0 - rate * twin_us / 1e6)
print(f"{max(0.0, calls + lost) / (secs * 1e3) * 100:.2f}")
EOF
}

# The small-kernel loop's pace moves by ~30 % in phases of seconds on these machines, untraced
# too: a mode and an untraced twin run at the same time, each on its own GPU and CPUs (swapped
# every rep), and the cost is the median of their per-rep ratios.
if [[ $PARTS == *" pair "* ]]; then
  read -r ga gb <<<"${PAIR_GPUS:-0 1}"
  if [ "$NGPU" -lt 2 ] || [ -z "$gb" ] || [ "$ga" -ge "$NGPU" ] || [ "$gb" -ge "$NGPU" ]; then
    check "pair" FAIL "needs 2 GPUs (PAIR_GPUS '${PAIR_GPUS:-0 1}'), found $NGPU"
  else
    N=${PAIR_N:-2500000}; W=$(awk "BEGIN { print int(${COST_WARM:-3} * 100000) }")
    ca=${PAIR_CPUS_A:-4-7}; cb=${PAIR_CPUS_B:-8-11}
    declare -A PR PE
    t0=$(date +%s); longest=0; done_reps=0
    for r in $(seq "$REPS"); do
      # PAIR_SECS: no rep is begun that would end after it (the figures of the reps done print).
      if [ -n "${PAIR_SECS:-}" ] && [ $(($(date +%s) - t0 + longest)) -gt "$PAIR_SECS" ]; then
        echo "pair: rep $r left out, it would end after PAIR_SECS=$PAIR_SECS"
        break
      fi
      tr0=$(date +%s)
      for m in ${PAIR_MODES:-off win}; do
        if [ $((r % 2)) = 1 ]; then g1=$ga g2=$gb c1=$ca c2=$cb; else g1=$gb g2=$ga c1=$cb c2=$ca; fi
        cost_run "$m" env CUDA_VISIBLE_DEVICES=$g1 taskset -c "$c1" "$PY" "$HERE/small_sync.py" "$N" 1.5 0 "$W" \
          >"$STATE/pair_${m}_$r.txt" 2>&1 &
        A=$!
        env CUDA_VISIBLE_DEVICES=$g2 taskset -c "$c2" "$PY" "$HERE/small_sync.py" "$N" 1.5 0 "$W" >"$STATE/pair_${m}_twin_$r.txt" 2>&1 &
        B=$!
        wait $A $B
        va=$(grep -oE 'per_op_us=[0-9.]+' "$STATE/pair_${m}_$r.txt" | tail -1 | cut -d= -f2)
        vb=$(grep -oE 'per_op_us=[0-9.]+' "$STATE/pair_${m}_twin_$r.txt" | tail -1 | cut -d= -f2)
        [ -z "$va" ] || [ -z "$vb" ] && { echo "pair $m rep $r:"; tail -n 3 "$STATE/pair_${m}_$r.txt" "$STATE/pair_${m}_twin_$r.txt"; continue; }
        PR[$m]="${PR[$m]:-} $(awk "BEGIN { printf \"%.4f\", $va / $vb }")"
        # The windows' cost by their own account (less noisy than the ratio): the calls on the
        # application's threads, and each window's launches against the twin's pace.
        est=
        [ "$m" != off ] && est=$(pair_estimate "$STATE/logs/cost_$m.log" "$vb" "$(grep -oE 'secs=[0-9.]+' "$STATE/pair_${m}_$r.txt" | cut -d= -f2)" 2>/dev/null)
        [ -n "$est" ] && PE[$m]="${PE[$m]:-} $est"
        echo "pair rep $r: $m $va us/op (GPU $g1) vs untraced twin $vb (GPU $g2): ratio $(awk "BEGIN { printf \"%.4f\", $va / $vb }")${est:+; by the account of the windows +$est %}"
      done
      done_reps=$r
      longest=$(( $(date +%s) - tr0 > longest ? $(date +%s) - tr0 : longest ))
    done
    for m in ${PAIR_MODES:-off win}; do
      figure "pair $m / untraced twin, small-kernel loop ($N ops), ratios of $done_reps reps:${PR[$m]:-} median $(echo "${PR[$m]:-}" | median)${PE[$m]:+; by the account of the windows (calls, and launches in windows against the pace of the twin) +%:${PE[$m]} median $(echo "${PE[$m]}" | median)}"
    done
    [ -n "${PR[win]:-}" ] && pass_if "windows (default) on the small-kernel loop <= 3 %, against a twin run at the same time" \
      "$(awk "BEGIN { print $(echo "${PR[win]}" | median) <= 1.03 ? 1 : 0 }")" "median ratio $(echo "${PR[win]}" | median)"
  fi
fi
