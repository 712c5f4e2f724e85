#!/usr/bin/env bash
# GPU check of PM sampling and the performance-monitor arbiter, in one go, on a machine with an
# NVIDIA GPU (H100/H200), CUDA 13, PyTorch (`python3`), `ncu` and `nvcc`:
#   1. `gpuprofd check-config` accepts the metric set (falling back to a smaller one if the
#      chip refuses it) and refuses a multi-pass metric and an unknown one, naming them;
#   2. the sampler child sees a PyTorch matmul loop in another process (SM active high) and an
#      idle GPU (near zero);
#   3. while the sampler holds GPU 0, `ncu` on a kernel fails; after
#      `gpuprofctl profile --pause --gpu 0` the same `ncu` succeeds; after `--resume` samples
#      flow again; a pause `--for 5s` expires by itself;
#   4. the PyTorch loop's slowdown with 1 ms sampling: one matmul process, windows paused and
#      sampling alternated, each sampling window against the paused windows either side;
#   5. the Prometheus endpoint serves the latest PM values.
# It prints a summary last (CHECK lines and figures) and copies logs to $OUT when set.
#
# Binaries: release builds of gpuprofd, gpuprof-sampler and gpuprofctl in .gpu/ (or GPUPROF_BIN). From a build
# machine (no Rust on the GPU machine):
#   cargo build --release -p gpuprofd -p gpuprof-sampler -p gpuprofctl
#   mkdir -p .gpu && cp target/release/{gpuprofd,gpuprof-sampler,gpuprofctl} .gpu/ && strip .gpu/*
#   grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
# then run `bash tests/gpu/pm_arbiter.sh` there with .gpu carried.
set -uo pipefail

BIN=${GPUPROF_BIN:-$PWD/.gpu}
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
GPU=${GPU:-0}
CUPTI_LIB=${GPUPROF_CUPTI_LIBRARY:-}
for c in /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 \
         /usr/local/cuda/lib64/libcupti.so.13; do
  [ -z "$CUPTI_LIB" ] && [ -e "$c" ] && CUPTI_LIB=$c
done
export LD_LIBRARY_PATH="$(dirname "${CUPTI_LIB:-/x/x}"):${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
STATE=$(mktemp -d /tmp/gpuprof-pm.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
FIGURES=()
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { FIGURES+=("$1"); echo ">>> $1"; }
DPID=

finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp "$STATE/gpuprofd.log" "$OUTDIR/pm_arbiter_gpuprofd.log" 2>/dev/null
    cp "$STATE/ncu_"*.txt "$OUTDIR/" 2>/dev/null
  fi
  echo
  echo "================ pm_arbiter summary ================"
  nvidia-smi -L 2>/dev/null | head -4
  printf '%s\n' "${SUMMARY[@]}" "${FIGURES[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1));; esac; done
  echo "$(( ${#SUMMARY[@]} - failed )) passed, $failed failed"
  # The exit status says whether every check passed (a check that failed: 1).
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT

[ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprof-sampler" ] && [ -x "$BIN/gpuprofctl" ] || { echo "no gpuprofd/gpuprof-sampler/gpuprofctl in $BIN"; exit 2; }
echo "libcupti: ${CUPTI_LIB:-not found}"; nvidia-smi -L

# ---------------------------------------------------------------- 1. metric set at config check
write_cfg() { # metrics (comma separated, quoted)
  cat >"$STATE/cfg.toml" <<EOF
log_level = "info"
[sampler]
# The behaviour checked here: the sampler holds the monitor all the time (metrics.sh checks
# the on-demand default).
always_on = true
metrics = [$1]
interval = "1ms"
cupti_library = "$CUPTI_LIB"
[prometheus]
listen = "127.0.0.1:9464"
EOF
}
SETS=(
  '"gr__cycles_active.avg.pct_of_peak_sustained_elapsed", "sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "sm__inst_executed_realtime.avg.per_cycle_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed"'
  '"sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "gr__cycles_active.avg.pct_of_peak_sustained_elapsed"'
  '"gr__cycles_active.avg", "sm__cycles_active.avg", "sm__inst_executed_realtime.avg.per_cycle_active", "gr__cycles_elapsed.max"'
)
CHOSEN=
for s in "${SETS[@]}"; do
  write_cfg "$s"
  if out=$("$BIN/gpuprofd" check-config "$STATE/cfg.toml" 2>&1); then CHOSEN=$s; echo "$out"; break; fi
  echo "refused: $out"
done
[ -n "$CHOSEN" ] && check "metric set accepted by check-config" PASS "$CHOSEN" || check "metric set accepted" FAIL
write_cfg '"sm__throughput.avg.pct_of_peak_sustained_elapsed"'
out=$("$BIN/gpuprofd" check-config "$STATE/cfg.toml" 2>&1); rc=$?; echo "$out"
[ $rc -eq 2 ] && grep -q "sm__throughput.avg.pct_of_peak_sustained_elapsed" <<<"$out" && grep -q pass <<<"$out" \
  && check "multi-pass metric refused, named" PASS || check "multi-pass metric refused, named" FAIL "rc=$rc"
write_cfg '"sm__cycles_active.avg", "sm__no_such_counter.sum"'
out=$("$BIN/gpuprofd" check-config "$STATE/cfg.toml" 2>&1); rc=$?; echo "$out"
[ $rc -eq 2 ] && grep -q "sm__no_such_counter.sum" <<<"$out" && check "unknown metric refused, named" PASS \
  || check "unknown metric refused, named" FAIL "rc=$rc"
write_cfg "${CHOSEN:-${SETS[2]}}"
SM_METRIC=$(grep -o 'sm__cycles_active[a-z_.]*' <<<"${CHOSEN:-${SETS[2]}}" | head -1)

# ---------------------------------------------------------------- daemon
"$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs_since() { awk -v a="$1" -v b="$(now_ms)" 'BEGIN { printf "%.2f", (b - a) / 1000 }'; }
# Sampling on $GPU: its sampler reports sampling and nothing else holds the monitor.
sampling() {
  "${CTL[@]}" --json status 2>/dev/null | $PY -c "
import json, re, sys
note = json.load(sys.stdin)['gpu_note']
seg = [s for s in re.split(r';\s*(?=GPU \d+:)', note) if s.startswith('GPU $GPU:')]
sys.exit(0 if seg and seg[0].startswith('GPU $GPU: sampler sampling') and 'monitor' not in seg[0] else 1)"
}
wait_sampling() { # timeout_s → prints seconds waited; rc 0 once sampling
  local t0; t0=$(now_ms)
  while [ $(( $(now_ms) - t0 )) -lt $(( $1 * 1000 )) ]; do
    if sampling; then secs_since "$t0"; return 0; fi
    sleep 0.05
  done
  return 1
}
if w=$(wait_sampling 40); then check "sampler child started and sampling GPU $GPU" PASS "${w}s"
else check "sampler child started and sampling GPU $GPU" FAIL; "${CTL[@]}" status; tail -30 "$STATE/gpuprofd.log"; exit 1; fi
"${CTL[@]}" status

mean_sm() { # count → mean of the SM metric over `count` samples (100 ms averages)
  timeout 20 "${CTL[@]}" --json pm watch --gpu "$GPU" --metric "$SM_METRIC" --downsample 100ms --count "$1" \
    | $PY -c "
import json,sys
v=[json.loads(l)['values']['$SM_METRIC'] for l in sys.stdin if '\"values\"' in l]
print(f'{sum(v)/len(v):.3f}' if v else 'nan')"
}

# ---------------------------------------------------------------- 2. PyTorch loop seen
cat >"$STATE/mm.py" <<'EOF'
import sys, time, torch
secs = float(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(20): c = a @ b
torch.cuda.synchronize()
print("READY", flush=True)
it = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize(); it += 20
dt = time.perf_counter() - t0
print(f"ITERS_PER_S {it/dt:.3f}", flush=True)
EOF
idle=$(mean_sm 10)
CUDA_VISIBLE_DEVICES=$GPU $PY "$STATE/mm.py" 14 >"$STATE/mm_seen.txt" 2>&1 &
MM=$!
for _ in $(seq 600); do grep -q READY "$STATE/mm_seen.txt" 2>/dev/null && break; sleep 0.05; done
sleep 1
busy=$(mean_sm 20)
wait $MM
figure "SM metric $SM_METRIC: idle $idle, PyTorch matmul loop in another process $busy"
$PY - "$idle" "$busy" "$SM_METRIC" <<'EOF' && check "sampler sees the PyTorch loop (SM active high, idle near zero)" PASS "idle $idle, busy $busy" || check "sampler sees the PyTorch loop" FAIL "idle $idle, busy $busy"
import sys, math
idle, busy, m = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ok = not math.isnan(idle) and not math.isnan(busy)
if "pct" in m: ok = ok and busy > 50 and idle < 5
else: ok = ok and busy > 10 * max(idle, 1e-9)
sys.exit(0 if ok else 1)
EOF

# ---------------------------------------------------------------- 3. ncu vs the sampler, pause/resume
cat >"$STATE/k.cu" <<'EOF'
#include <cstdio>
__global__ void gpuprof_probe(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = p[i] * 2.0f + 1.0f; }
int main() { float *d; int n = 1 << 20; cudaMalloc(&d, n * 4); gpuprof_probe<<<n / 256, 256>>>(d, n); cudaError_t e = cudaDeviceSynchronize(); printf("kernel: %s\n", cudaGetErrorString(e)); return e != cudaSuccess; }
EOF
if command -v nvcc >/dev/null && nvcc -O2 -arch=sm_90 -o "$STATE/k" "$STATE/k.cu" >"$STATE/nvcc.txt" 2>&1; then
  NCU_TARGET=("$STATE/k")
else
  echo "nvcc failed or missing ($(cat "$STATE/nvcc.txt" 2>/dev/null)); profiling a PyTorch kernel instead"
  NCU_TARGET=($PY -c "import torch; x=torch.ones(1<<20, device='cuda'); y=x*2; torch.cuda.synchronize(); print('kernel: ok')")
fi
run_ncu() { # name → rc 0 if ncu profiled the kernel
  CUDA_VISIBLE_DEVICES=$GPU timeout 180 ncu --target-processes all -c 1 --section SpeedOfLight "${NCU_TARGET[@]}" >"$STATE/ncu_$1.txt" 2>&1
  local rc=$?
  echo "--- ncu ($1) rc=$rc:"; grep -E "==ERROR==|==PROF==|==WARNING==|Duration|SM Frequency|resource" "$STATE/ncu_$1.txt" | head -8
  [ $rc -eq 0 ] && ! grep -q "==ERROR==" "$STATE/ncu_$1.txt" && grep -qE "Duration|Section: GPU Speed Of Light" "$STATE/ncu_$1.txt"
}
if run_ncu while_sampling; then check "ncu fails while the sampler holds GPU $GPU" FAIL "ncu succeeded"
else check "ncu fails while the sampler holds GPU $GPU" PASS "$(grep -m1 -oE 'Profiling failed[^.]*|==ERROR==.*' "$STATE/ncu_while_sampling.txt" | head -c 160)"; fi

t0=$(now_ms)
"${CTL[@]}" profile --pause --gpu "$GPU" --reason "ncu check"
for _ in $(seq 200); do grep -q "GPU $GPU: sampler stopped" <<<"$("${CTL[@]}" --json status)" && break; sleep 0.02; done
figure "pause → sampler reported the hardware released after $(secs_since "$t0") s"
"${CTL[@]}" profile --status
if run_ncu paused; then check "ncu succeeds after profile --pause --gpu $GPU" PASS
else check "ncu succeeds after profile --pause --gpu $GPU" FAIL "$(grep -m1 -E '==ERROR==' "$STATE/ncu_paused.txt")"; fi

t0=$(now_ms)
"${CTL[@]}" profile --resume --gpu "$GPU"
n=$(timeout 15 "${CTL[@]}" --json pm watch --gpu "$GPU" --downsample 0 --count 50 | grep -c '"values"')
lat=$(secs_since "$t0")
[ "${n:-0}" -ge 50 ] && check "samples flow again after --resume" PASS "50 samples ${lat}s after resume" \
  || check "samples flow again after --resume" FAIL "$n samples"

"${CTL[@]}" profile --pause --gpu "$GPU" --for 5s --reason "expiry check"
t0=$(now_ms)
sleep 1
paused_ok=$("${CTL[@]}" --json profile --status | $PY -c "import json,sys; d=json.load(sys.stdin); print(d[0]['holder']['holder_kind'])")
if w=$(wait_sampling 15); then
  total=$(secs_since "$t0")
  $PY -c "import sys; sys.exit(0 if 4.5 <= $total <= 7.5 else 1)" && [ "$paused_ok" = pause ] \
    && check "pause --for 5s expires by itself" PASS "sampling again ${total}s after the pause" \
    || check "pause --for 5s expires by itself" FAIL "holder $paused_ok, sampling after ${total}s"
else check "pause --for 5s expires by itself" FAIL "not sampling 16 s later"; fi

# ---------------------------------------------------------------- 4. slowdown of the PyTorch loop with 1 ms sampling
# One matmul process runs throughout (tests/gpu/mm_windows.py); windows with the GPU paused
# ("off") alternate with windows sampling every 1 ms ("on"), starting and ending with "off";
# each "on" window is compared with the "off" windows on either side, so warm-up and thermal
# drift cancel instead of counting against whichever state comes second.
HERE=$(cd "$(dirname "$0")" && pwd)
CYCLES=${SLOWDOWN_CYCLES:-8}
WIN=${SLOWDOWN_WINDOW_S:-3}
: >"$STATE/windows"
CUDA_VISIBLE_DEVICES=$GPU $PY "$HERE/mm_windows.py" run "$STATE/mm_log" "$STATE/mm_stop" 300 &
MMW=$!
for _ in $(seq 600); do [ -s "$STATE/mm_log" ] && break; sleep 0.05; done
sleep 8 # to a steady clock and temperature
window() { # label
  local t0 t1; sleep 0.5; t0=$(date +%s.%N); sleep "$WIN"; t1=$(date +%s.%N); echo "$1 $t0 $t1" >>"$STATE/windows"
}
pause_gpu() { "${CTL[@]}" profile --pause --gpu "$GPU" --for 120s --reason "slowdown baseline" >/dev/null; }
pause_gpu; window off
for _ in $(seq "$CYCLES"); do
  "${CTL[@]}" profile --resume --gpu "$GPU" >/dev/null; wait_sampling 10 >/dev/null; window on
  pause_gpu; window off
done
touch "$STATE/mm_stop"; wait $MMW
"${CTL[@]}" profile --resume --gpu "$GPU" >/dev/null
analysis=$($PY "$HERE/mm_windows.py" analyze "$STATE/mm_log" "$STATE/windows")
echo "$analysis"
slow=$(grep -oE "^on: slowdown median [-0-9.]+" <<<"$analysis" | awk '{print $4}')
detail=$(grep "^on:" <<<"$analysis" | sed 's/^on: //')
figure "PyTorch matmul loop slowdown with 1 ms PM sampling: ${slow:-?} % ($detail; baseline $(grep '^off:' <<<"$analysis" | grep -oE 'median [0-9.]+ matmul/s'))"
$PY -c "import sys; sys.exit(0 if ${slow:-99} <= 0.5 else 1)" 2>/dev/null && check "slowdown at 1 ms <= 0.5 %" PASS "${slow} %" \
  || check "slowdown at 1 ms <= 0.5 %" FAIL "${slow:-?} %"

# ---------------------------------------------------------------- 5. Prometheus, status, audit
prom=$($PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())" 2>&1)
grep -E "^gpuprof_pm_(percent|value)\{gpu=\"$GPU\"" <<<"$prom" | head -5
grep -qE "^gpuprof_pm_(percent|value)\{gpu=\"$GPU\",.*metric=\"$SM_METRIC\"\}" <<<"$prom" \
  && check "Prometheus endpoint has the latest PM values" PASS || check "Prometheus endpoint has the latest PM values" FAIL
"${CTL[@]}" status
samples=$("${CTL[@]}" --json status | $PY -c "import json,sys; print(json.load(sys.stdin)['records']['pm_sample']['ingested'])" 2>/dev/null)
figure "pm_sample values stored: ${samples:-?}"
$PY - "$STATE/gpuprof.db" <<'EOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print("audit:", ", ".join(f"{e} {n}" for e, n in c.execute("SELECT event, COUNT(*) FROM audit GROUP BY event")))
EOF
grep -iE "warn|error" "$STATE/gpuprofd.log" | grep -v "slow PM stream" | tail -5 || true
