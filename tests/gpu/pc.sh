#!/usr/bin/env bash
# GPU check of continuous PC sampling, end to end, on a machine with an NVIDIA GPU (H100/H200),
# CUDA 13 (`nvcc`), PyTorch (`python3`) and `ncu`:
#   1. a CUDA C workload built with -lineinfo (pc_kernel.cu), sampled from its start in a session
#      with --pc-sampling: `pc top --by function|line|stall`, the hottest line must be the
#      dependent load in `gather` (pc_kernel.cu:15, stalled on long scoreboard), and a pprof
#      export is written;
#   2. the user story on a PyTorch bf16 matmul loop already running: `gpuprofctl trace --pid P
#      --pc-sampling --duration 6s`, then `pc top` names the GEMM kernel with its stall reasons;
#      `pc watch --json` started with a session shows its first row within 2 s;
#   3. a pause frees the GPU for ncu during a PC-sampling session (session show says preempted
#      within 1 s, ncu profiles a kernel), and samples come again after the resume;
#   4. the cost at the default period, medians of REPS (default 5) alternating runs in one go:
#      a bf16 8192^3 matmul loop (target <= 1 %) and the 100k-small-kernel PyTorch loop (target
#      <= 5 %), untraced, PC sampling alone (preset pc), traced (kernels) and traced with PC
#      sampling;
#   5. samples lost to the daemon: the injectors' totals against what the daemon stored.
# PARTS (default "1 2 3 4 5") leaves 3 and 4 out when they are not named (1, 2 and 5 always run).
# It prints a summary last (CHECK and FIGURE lines) and copies logs to $OUT when set.
#
# Binaries: release builds in .gpu/ (or GPUPROF_BIN): gpuprofd, gpuprofctl, gpuprof-sampler and
# libgpuprof_inject.so (`cargo build --release`, then `strip -o .gpu/X target/release/X`).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
REPS=${REPS:-5}
PARTS=" ${PARTS:-1 2 3 4 5} "
export PATH="/usr/local/cuda/bin:$PATH"
STATE=$(mktemp -d /tmp/gpuprof-pc.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
FIGURES=()
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { FIGURES+=("FIGURE $1"); echo ">>> FIGURE $1"; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
now_ms() { date +%s%3N; }
jq_py() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
DPID=

finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp "$STATE/gpuprofd.log" "$OUTDIR/pc_gpuprofd.log" 2>/dev/null
    cp "$STATE"/*.txt "$OUTDIR/" 2>/dev/null
  fi
  echo
  echo "================ pc summary ================"
  nvidia-smi -L 2>/dev/null | head -2
  printf '%s\n' "${SUMMARY[@]}" "${FIGURES[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1));; esac; done
  echo "$(( ${#SUMMARY[@]} - failed )) passed, $failed failed"
  # The exit status says whether every check passed (a check that failed: 1).
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT

[ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }
nvidia-smi -L | head -2
cat >"$STATE/cfg.toml" <<EOF
log_level = "info"
EOF
export GPUPROF_AGENT_SOCKET=$STATE/agent.sock
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
"${CTL[@]}" status >/dev/null 2>&1 || { echo "gpuprofd did not start"; cat "$STATE/gpuprofd.log"; exit 2; }

nvcc -O2 -lineinfo -o "$STATE/pc_kernel" "$HERE/pc_kernel.cu" >"$STATE/nvcc.txt" 2>&1 || { cat "$STATE/nvcc.txt"; exit 2; }
cat >"$STATE/mm.py" <<'EOF'
# bf16 8192^3 matmuls for argv[1] s after argv[2] s of warm-up; prints ms per matmul.
import sys, time, torch
secs, warm = float(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t0 = time.time()
while time.time() - t0 < warm: c = a @ b; torch.cuda.synchronize()
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    for _ in range(10): c = a @ b
    torch.cuda.synchronize(); n += 10
print(f"MM ms_per_iter={(time.perf_counter() - t0) * 1e3 / n:.4f} iters={n}", flush=True)
EOF
session_start() { "${CTL[@]}" --json session start "$@" | jq_py 'd["id"]'; }

# ---------------------------------------------------------------- 1. CUDA C from its start
S1=$(session_start --exe pc_kernel --pc-sampling --name pc-cuda)
GPUPROF_LOG=${PC_LOG:-info} GPUPROF_LOG_FILE="$STATE/inj_pc_kernel.txt" CUDA_INJECTION64_PATH="$INJ" "$STATE/pc_kernel" 6 500 >"$STATE/pc_kernel.txt" 2>&1
"${CTL[@]}" session stop "$S1" >/dev/null
sleep 0.5
echo "--- session $S1"; "${CTL[@]}" session show "$S1" | tail -8
for by in function line stall; do echo "--- pc top $S1 --by $by"; "${CTL[@]}" pc top "$S1" --by $by --limit 6; done
top_line=$("${CTL[@]}" --json pc top "$S1" --by line --limit 1 | jq_py '"%s:%d %s %s" % (d["rows"][0]["file"].split("/")[-1], d["rows"][0]["line"], d["rows"][0]["function"], d["rows"][0]["stalls"][0]["reason"]) if d["rows"] else "none"')
total1=$("${CTL[@]}" --json pc top "$S1" | jq_py 'd["total_samples"]')
pass_if "CUDA C: samples stored" "$([ "${total1:-0}" -gt 0 ] 2>/dev/null && echo 1)" "$total1 samples"
pass_if "CUDA C: hottest line is gather's dependent load (pc_kernel.cu:15)" \
  "$(grep -q '^pc_kernel.cu:15 gather' <<<"$top_line" && echo 1)" "$top_line"
pass_if "CUDA C: its top stall is long scoreboard" "$(grep -q 'long_scoreboard' <<<"$top_line" && echo 1)" "$top_line"
"${CTL[@]}" export "$S1" --format pprof -o "$STATE/prof.pb.gz" >/dev/null 2>&1
psize=$(stat -c %s "$STATE/prof.pb.gz" 2>/dev/null || echo 0)
pass_if "pprof export written (gzip)" "$([ "$psize" -gt 100 ] && [ "$(head -c2 "$STATE/prof.pb.gz" | od -An -tx1 | tr -d ' ')" = 1f8b ] && echo 1)" "$psize bytes"

# ---------------------------------------------------------------- 2. the user story on PyTorch
CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 14 1 >"$STATE/mm_story.txt" 2>&1 &
MMPID=$!
sleep 4
"${CTL[@]}" trace --pid "$MMPID" --pc-sampling --duration 6s >"$STATE/trace_story.txt" 2>&1
echo "--- gpuprofctl trace --pid $MMPID --pc-sampling --duration 6s"; tail -25 "$STATE/trace_story.txt"
S2=$("${CTL[@]}" --json session list | jq_py 'max(s["id"] for s in (d["sessions"] if isinstance(d, dict) else d))')
wait $MMPID
echo "--- pc top $S2"; "${CTL[@]}" pc top "$S2" --limit 5
fn2=$("${CTL[@]}" --json pc top "$S2" --limit 1 | jq_py '"%s | %s" % (d["rows"][0]["function"], ", ".join(s["reason"] for s in d["rows"][0]["stalls"][:3])) if d["rows"] else "none"')
pass_if "PyTorch late attach: pc top names the GEMM kernel with stall reasons" \
  "$(grep -qiE '(gemm|nvjet|cutlass|sm90).*\| .*stall' <<<"$fn2" && echo 1)" "$fn2"

# First row visible to pc watch after session start.
GPUPROF_LOG=${PC_LOG:-info} GPUPROF_LOG_FILE="$STATE/inj_mm_watch.txt" CUDA_INJECTION64_PATH="$INJ" "$PY" "$STATE/mm.py" 12 1 >"$STATE/mm_watch.txt" 2>&1 &
MMPID=$!
# The process first connects (torch initializes CUDA), then the session starts.
for _ in $(seq 300); do "${CTL[@]}" --json procs 2>/dev/null | grep -q "\"pid\": *$MMPID\b" && break; sleep 0.05; done
sleep 1
t0=$(now_ms)
S3=$(session_start --pid "$MMPID" --pc-sampling --name pc-watch)
timeout 8 "${CTL[@]}" --json pc watch "$S3" >"$STATE/watch.txt" 2>&1 &
WPID=$!
first=
for _ in $(seq 400); do
  if grep -q '"function"' "$STATE/watch.txt" 2>/dev/null; then first=$(( $(now_ms) - t0 )); break; fi
  sleep 0.02
done
wait $WPID 2>/dev/null
"${CTL[@]}" session show "$S3" | tail -4
"${CTL[@]}" session stop "$S3" >/dev/null
wait $MMPID
pass_if "first PC row in pc watch within 2 s of session start" "$([ -n "$first" ] && [ "$first" -le 2000 ] && echo 1)" "${first:-none} ms"
figure "first PC row after session start: ${first:-none} ms"

# ---------------------------------------------------------------- 3. pause for ncu, resume
if [[ $PARTS == *" 3 "* ]]; then
CUDA_INJECTION64_PATH="$INJ" "$STATE/pc_kernel" 30 500 >"$STATE/pc_kernel_pause.txt" 2>&1 &
KPID=$!
# The GPU it runs on, as gpuprofd numbers GPUs (NVML's index): the first of CUDA_VISIBLE_DEVICES
# when that names an index.
PGPU=${CUDA_VISIBLE_DEVICES%%,*}
[[ $PGPU =~ ^[0-9]+$ ]] || PGPU=0
S4=$(session_start --exe pc_kernel --pc-sampling --name pc-pause)
sleep 3
t0=$(now_ms)
"${CTL[@]}" profile --pause --gpu "$PGPU" --reason "ncu during PC sampling" >/dev/null
pre=
for _ in $(seq 100); do
  if "${CTL[@]}" session show "$S4" 2>/dev/null | grep -qi "preempted"; then pre=$(( $(now_ms) - t0 )); break; fi
  sleep 0.02
done
pass_if "pause: PC sampling preempted within 1 s" "$([ -n "$pre" ] && [ "$pre" -le 1000 ] && echo 1)" "${pre:-never} ms"
before=$("${CTL[@]}" --json pc top "$S4" | jq_py 'd["total_samples"]')
cat >"$STATE/k.cu" <<'EOF'
#include <cstdio>
__global__ void gpuprof_probe(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = p[i] * 2.0f + 1.0f; }
int main() { float *d; int n = 1 << 20; cudaMalloc(&d, n * 4); gpuprof_probe<<<n / 256, 256>>>(d, n); cudaError_t e = cudaDeviceSynchronize(); printf("kernel: %s\n", cudaGetErrorString(e)); return e != cudaSuccess; }
EOF
nvcc -O2 -o "$STATE/k" "$STATE/k.cu" >/dev/null 2>&1
timeout 120 ncu --target-processes all -c 1 --section SpeedOfLight "$STATE/k" >"$STATE/ncu_paused.txt" 2>&1
nrc=$?
pass_if "ncu profiles a kernel while PC sampling is paused" \
  "$([ $nrc -eq 0 ] && ! grep -q '==ERROR==' "$STATE/ncu_paused.txt" && grep -qE 'Duration|Speed Of Light' "$STATE/ncu_paused.txt" && echo 1)" \
  "rc $nrc $(grep -m1 '==ERROR==' "$STATE/ncu_paused.txt")"
"${CTL[@]}" profile --resume --gpu "$PGPU" >/dev/null
sleep 4
after=$("${CTL[@]}" --json pc top "$S4" | jq_py 'd["total_samples"]')
"${CTL[@]}" session show "$S4" | tail -4
pass_if "samples come again after the resume" "$([ "${after:-0}" -gt "${before:-0}" ] 2>/dev/null && echo 1)" "$before -> $after"
"${CTL[@]}" session stop "$S4" >/dev/null
kill $KPID 2>/dev/null; wait $KPID 2>/dev/null
fi

# ---------------------------------------------------------------- 4. cost
if [[ $PARTS == *" 4 "* ]]; then
cost_run() { # mode → prints the figure of one run
  local mode=$1; shift
  local s=
  case $mode in
    off) "$@" ;;
    kernels) s=$(session_start --exe python3 --preset kernels --name cost-k); CUDA_INJECTION64_PATH="$INJ" "$@" ;;
    pc) s=$(session_start --exe python3 --preset kernels --pc-sampling --name cost-pc); CUDA_INJECTION64_PATH="$INJ" "$@" ;;
    pconly) s=$(session_start --exe python3 --preset pc --pc-sampling --name cost-pconly); CUDA_INJECTION64_PATH="$INJ" "$@" ;;
  esac
  [ -n "$s" ] && "${CTL[@]}" session stop "$s" >/dev/null
}
declare -A MM SM
for r in $(seq "$REPS"); do
  for mode in off pconly kernels pc; do
    v=$(cost_run $mode "$PY" "$STATE/mm.py" 4 1 | grep -oE 'ms_per_iter=[0-9.]+' | cut -d= -f2)
    MM[$mode]="${MM[$mode]:-} $v"
    v=$(cost_run $mode "$PY" "$HERE/bench_torch.py" off 100000 1.5 | grep -oE 'per_op_us=[0-9.]+' | cut -d= -f2)
    SM[$mode]="${SM[$mode]:-} $v"
  done
  echo "rep $r (off/pc only/kernels/kernels+pc): matmul ms ${MM[off]##* }/${MM[pconly]##* }/${MM[kernels]##* }/${MM[pc]##* }  small us ${SM[off]##* }/${SM[pconly]##* }/${SM[kernels]##* }/${SM[pc]##* }"
done
mm_off=$(echo "${MM[off]}" | median); mm_k=$(echo "${MM[kernels]}" | median); mm_pc=$(echo "${MM[pc]}" | median)
sm_off=$(echo "${SM[off]}" | median); sm_k=$(echo "${SM[kernels]}" | median); sm_pc=$(echo "${SM[pc]}" | median)
mm_po=$(echo "${MM[pconly]}" | median); sm_po=$(echo "${SM[pconly]}" | median)
figure "PC sampling alone (preset pc): matmul $mm_po ms/iter ($(calc "($mm_po / $mm_off - 1) * 100") % vs untraced), small kernels $sm_po us/op ($(calc "($sm_po / $sm_off - 1) * 100") % vs untraced)"
figure "bf16 matmul ms/iter medians of $REPS: untraced $mm_off, traced $mm_k, traced+PC $mm_pc → PC vs untraced $(calc "($mm_pc / $mm_off - 1) * 100") %, vs traced $(calc "($mm_pc / $mm_k - 1) * 100") %"
figure "100k small kernels us/op medians of $REPS: untraced $sm_off, traced $sm_k, traced+PC $sm_pc → PC vs untraced $(calc "($sm_pc / $sm_off - 1) * 100") %, vs traced $(calc "($sm_pc / $sm_k - 1) * 100") %"
pass_if "matmul cost of PC sampling alone <= 1 % (vs untraced)" "$(awk "BEGIN { print ($mm_po / $mm_off - 1) * 100 <= 1 ? 1 : 0 }")" "$(calc "($mm_po / $mm_off - 1) * 100") %"
pass_if "small-kernel cost of PC sampling alone <= 5 % (vs untraced)" "$(awk "BEGIN { print ($sm_po / $sm_off - 1) * 100 <= 5 ? 1 : 0 }")" "$(calc "($sm_po / $sm_off - 1) * 100") %"
pass_if "matmul cost of tracing with PC sampling <= 1 % (vs untraced)" "$(awk "BEGIN { print ($mm_pc / $mm_off - 1) * 100 <= 1 ? 1 : 0 }")" "$(calc "($mm_pc / $mm_off - 1) * 100") %"
fi

# ---------------------------------------------------------------- 5. lost to the daemon
lost=$("${CTL[@]}" --json session show "$S1" | jq_py 'sum(p.get("dropped", 0) for s in [d] for p in s.get("processes", []))')
stored=$("${CTL[@]}" --json pc top "$S1" | jq_py 'd["total_samples"]')
reported=$("${CTL[@]}" --json session show "$S1" | jq_py 'sum(x.get("samples", 0) for p in d.get("processes", []) for x in p.get("pc_sampling", []))')
hwdrop=$("${CTL[@]}" --json session show "$S1" | jq_py 'sum(x.get("dropped", 0) for p in d.get("processes", []) for x in p.get("pc_sampling", []))')
figure "CUDA C session: samples the injector reported $reported, stored in rows $stored (stall reasons not collected and non-user kernels are in the first only), hardware drops $hwdrop, records dropped $lost"
pass_if "no records lost between the injector and the daemon" "$([ "${lost:-x}" = 0 ] && echo 1)" "records dropped $lost"
