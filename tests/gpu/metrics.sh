#!/usr/bin/env bash
# GPU check of the always-on device metrics (NVML + GPM) and on-demand CUPTI PM sampling, on a
# machine with an NVIDIA Hopper GPU, CUDA 13, PyTorch (`python3`), `ncu` and `nvcc`:
#   1. `gpuprofctl devices` lists what `nvidia-smi -L` lists (index, name, UUID);
#   2. GPM SM activity: < 5 % on the idle GPU, > 50 % during a bf16 8192^3 matmul loop; the
#      Prometheus endpoint serves it in DCGM exporter's shape;
#   3. `ncu` profiles a kernel while the always-on metrics run, without any pause;
#   4. `pm watch --source cupti --rate 1khz` starts the CUPTI PM sampler on demand (~1000
#      samples/s), `gpuprofctl profile --pause` frees the monitor (ncu then works), and the
#      sampler stops when its watcher leaves;
#   5. overhead: one matmul process (mm_windows.py); windows without gpuprofd alternate with
#      windows where gpuprofd runs its always-on metrics at 1 s and at 100 ms (5 of each, each
#      against the windows without either side; median); gpuprofd's CPU time in those windows,
#      as % of one core per GPU. Targets: <= 0.1 % slowdown, <= 0.5 % of a core at 1 s.
# PASS/FAIL lines as it goes, a summary last; logs go to $OUT when set. About 6-8 minutes.
#
# Binaries: release builds of gpuprofd, gpuprof-sampler and gpuprofctl in .gpu/ (or GPUPROF_BIN):
#   cargo build --release -p gpuprofd -p gpuprof-sampler -p gpuprofctl
#   mkdir -p .gpu && cp target/release/{gpuprofd,gpuprof-sampler,gpuprofctl} .gpu/ && strip .gpu/*
# Knobs: GPU (index, default 0), PYTHON, GPUPROF_CUPTI_LIBRARY, WINDOW_S (overhead window, 6),
# CYCLES (overhead cycles, 5).
set -uo pipefail

BIN=${GPUPROF_BIN:-$PWD/.gpu}
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
GPU=${GPU:-0}
WINDOW_S=${WINDOW_S:-6}
CYCLES=${CYCLES:-5}
CUPTI_LIB=${GPUPROF_CUPTI_LIBRARY:-}
for c in /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 \
         /usr/local/cuda/lib64/libcupti.so.13; do
  [ -z "$CUPTI_LIB" ] && [ -e "$c" ] && CUPTI_LIB=$c
done
export LD_LIBRARY_PATH="$(dirname "${CUPTI_LIB:-/x/x}"):${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
STATE=$(mktemp -d /tmp/gpuprof-metrics.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
FIGURES=()
check() { SUMMARY+=("$2 $1${3:+ ($3)}"); echo ">>> $2 $1${3:+ ($3)}"; }
figure() { FIGURES+=("$1"); echo ">>> $1"; }
DPID=
MMPID=
WPID=

stop_daemon() {
  if [ -n "$DPID" ]; then kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; fi
  DPID=
}
finish() {
  [ -n "$WPID" ] && kill "$WPID" 2>/dev/null
  [ -n "$MMPID" ] && { touch "$STATE/mm_stop"; wait "$MMPID" 2>/dev/null; }
  stop_daemon
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp "$STATE"/gpuprofd*.log "$STATE"/ncu_*.txt "$STATE"/windows "$STATE"/analysis.txt "$OUTDIR/" 2>/dev/null
  fi
  echo
  echo "================ metrics summary ================"
  nvidia-smi -L 2>/dev/null | head -4
  printf '%s\n' "${SUMMARY[@]}" "${FIGURES[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in FAIL*) failed=$((failed + 1));; esac; done
  echo "$(( ${#SUMMARY[@]} - failed )) passed, $failed failed"
  # The exit status says whether every check passed (a check that failed: 1).
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT

[ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprof-sampler" ] && [ -x "$BIN/gpuprofctl" ] || { echo "no gpuprofd/gpuprof-sampler/gpuprofctl in $BIN"; exit 2; }
echo "libcupti: ${CUPTI_LIB:-not found}"; nvidia-smi -L

write_cfg() { # file interval
  cat >"$1" <<EOF
log_level = "info"
[metrics]
interval = "$2"
[sampler]
cupti_library = "$CUPTI_LIB"
[prometheus]
listen = "127.0.0.1:9465"
EOF
}
start_daemon() { # config log
  "$BIN/gpuprofd" --state-dir "$STATE" --config "$1" >"$STATE/$2" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# GPM SM activity: median of N one-sample readings (JSON lines from pm watch).
gpm_sm() { # count
  timeout 60 "${CTL[@]}" --json pm watch --gpu "$GPU" --source gpm --downsample 0 --count "$1" 2>"$STATE/watch_err.txt" \
    | $PY -c "
import json, statistics, sys
v = [json.loads(l)['values'].get('sm_active_percent') for l in sys.stdin if l.strip()]
v = [x for x in v if x is not None]
print(f'{statistics.median(v):.1f}' if v else 'none')"
}

write_cfg "$STATE/cfg1s.toml" 1s
write_cfg "$STATE/cfg100ms.toml" 100ms
start_daemon "$STATE/cfg1s.toml" gpuprofd.log || { check "gpuprofd starts" FAIL "$(tail -5 "$STATE/gpuprofd.log")"; exit 1; }
grep -E "NVML|driver" "$STATE/gpuprofd.log" | head -3

# ---------------------------------------------------------------- 1. inventory
"${CTL[@]}" devices
"${CTL[@]}" --json devices >"$STATE/devices.json"
nvidia-smi -L >"$STATE/smi.txt"
if $PY - "$STATE/devices.json" "$STATE/smi.txt" <<'EOF'
import json, re, sys
devs = json.load(open(sys.argv[1]))
ours = sorted((d["index"], d["name"], d["uuid"]) for d in devs if d.get("origin") == "nvml")
smi = sorted((int(m[0]), m[1], m[2]) for m in re.findall(r"GPU (\d+): (.*) \(UUID: (GPU-[0-9a-f-]+)\)", open(sys.argv[2]).read()))
print("gpuprof:", ours); print("nvidia-smi:", smi)
sys.exit(0 if ours and ours == smi else 1)
EOF
then check "gpuprofctl devices matches nvidia-smi -L" PASS; else check "gpuprofctl devices matches nvidia-smi -L" FAIL; fi
GPM_OK=$($PY -c "import json; d=[x for x in json.load(open('$STATE/devices.json')) if x['index']==$GPU]; print(int(bool(d and d[0].get('gpm_supported'))))")
[ "$GPM_OK" = 1 ] && check "GPM supported on GPU $GPU" PASS || check "GPM supported on GPU $GPU" FAIL

# ---------------------------------------------------------------- 2. GPM SM activity idle / busy
idle=$(gpm_sm 4)
awk -v v="$idle" 'BEGIN { exit !(v != "none" && v < 5) }' && check "GPM SM activity idle < 5 %" PASS "$idle %" \
  || check "GPM SM activity idle < 5 %" FAIL "$idle % $(head -c 200 "$STATE/watch_err.txt")"
rm -f "$STATE/mm_stop"
CUDA_VISIBLE_DEVICES=$GPU $PY "$HERE/mm_windows.py" run "$STATE/mm_busy" "$STATE/mm_stop" 60 &
MMPID=$!
for _ in $(seq 300); do [ -s "$STATE/mm_busy" ] && [ "$(wc -l <"$STATE/mm_busy")" -ge 3 ] && break; sleep 0.1; done
busy=$(gpm_sm 4)
awk -v v="$busy" 'BEGIN { exit !(v != "none" && v > 50) }' && check "GPM SM activity during a bf16 matmul loop > 50 %" PASS "$busy %" \
  || check "GPM SM activity during a bf16 matmul loop > 50 %" FAIL "$busy %"
prom=$($PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9465/metrics', timeout=5).read().decode())" 2>&1)
echo "$prom" >"$STATE/metrics.txt"
grep -E "^gpuprof_gpu_(sm_active_percent|power_usage_watts|sm_clock_hertz)\{" <<<"$prom" | head -3
grep -qE "^gpuprof_gpu_sm_active_percent\{gpu=\"$GPU\",UUID=\"GPU-[0-9a-f-]+\",pci_bus_id=\"[0-9a-f:.]+\",modelName=\"[^\"]+\",Hostname=" <<<"$prom" \
  && check "Prometheus: GPM SM activity with DCGM exporter labels" PASS || check "Prometheus: GPM SM activity with DCGM exporter labels" FAIL
# promtool: its only findings may be DCGM exporter's camelCase label names (docs/operating.md, Label names).
if command -v promtool >/dev/null; then
  lint=$(promtool check metrics <"$STATE/metrics.txt" 2>&1); rc=$?
  other=$(grep -v " label names should be written in 'snake_case' not 'camelCase'\$" <<<"$lint" | grep -v '^$' || true)
  { [ "$rc" = 0 ] || [ "$rc" = 3 ]; } && [ -z "$other" ] && check "promtool check metrics" PASS \
    || check "promtool check metrics" FAIL "$other"
else
  check "promtool check metrics" FAIL "promtool is not installed (apt-get install prometheus)"
fi
touch "$STATE/mm_stop"; wait "$MMPID" 2>/dev/null; MMPID=

# ---------------------------------------------------------------- 3. ncu while the metrics run
cat >"$STATE/k.cu" <<'EOF'
#include <cstdio>
__global__ void gpuprof_probe(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = p[i] * 2.0f + 1.0f; }
int main() { float *d; int n = 1 << 20; cudaMalloc(&d, n * 4); gpuprof_probe<<<n / 256, 256>>>(d, n); cudaError_t e = cudaDeviceSynchronize(); printf("kernel: %s\n", cudaGetErrorString(e)); return e != cudaSuccess; }
EOF
if command -v nvcc >/dev/null && nvcc -O2 -arch=sm_90 -o "$STATE/k" "$STATE/k.cu" >"$STATE/nvcc.txt" 2>&1; then
  NCU_TARGET=("$STATE/k")
else
  NCU_TARGET=($PY -c "import torch; x=torch.ones(1<<20, device='cuda'); y=x*2; torch.cuda.synchronize(); print('kernel: ok')")
fi
run_ncu() { # name → rc 0 if ncu profiled the kernel
  CUDA_VISIBLE_DEVICES=$GPU timeout 180 ncu --target-processes all -c 1 --section SpeedOfLight "${NCU_TARGET[@]}" >"$STATE/ncu_$1.txt" 2>&1
  local rc=$?
  echo "--- ncu ($1) rc=$rc:"; grep -E "==ERROR==|==PROF==|Duration|resource" "$STATE/ncu_$1.txt" | head -5
  [ $rc -eq 0 ] && ! grep -q "==ERROR==" "$STATE/ncu_$1.txt" && grep -qE "Duration|Section: GPU Speed Of Light" "$STATE/ncu_$1.txt"
}
"${CTL[@]}" profile --status
if run_ncu always_on; then check "ncu profiles a kernel while the always-on metrics run (no pause)" PASS
else check "ncu profiles a kernel while the always-on metrics run (no pause)" FAIL "$(grep -m1 '==ERROR==' "$STATE/ncu_always_on.txt")"; fi
after=$(gpm_sm 2)
[ "$after" != none ] && check "GPM still reads after ncu" PASS "$after %" || check "GPM still reads after ncu" FAIL

# ---------------------------------------------------------------- 4. CUPTI PM on demand, then a pause
"${CTL[@]}" --json pm watch --gpu "$GPU" --source cupti --rate 1khz --downsample 0 >"$STATE/cupti.jsonl" 2>"$STATE/cupti_err.txt" &
WPID=$!
t0=$(now_ms)
while [ $(( $(now_ms) - t0 )) -lt 40000 ] && ! grep -q '"source":"cupti_pm"' "$STATE/cupti.jsonl"; do sleep 0.1; done
if grep -q '"source":"cupti_pm"' "$STATE/cupti.jsonl"; then
  n0=$(grep -c cupti_pm "$STATE/cupti.jsonl"); sleep 3; n1=$(grep -c cupti_pm "$STATE/cupti.jsonl")
  rate=$(( (n1 - n0) / 3 ))
  [ "$rate" -ge 600 ] && check "pm watch --source cupti --rate 1khz starts the sampler on demand" PASS "$rate samples/s, first after $(( ($(now_ms) - t0) / 1000 - 3 )) s" \
    || check "pm watch --source cupti --rate 1khz starts the sampler on demand" FAIL "$rate samples/s"
else
  check "pm watch --source cupti --rate 1khz starts the sampler on demand" FAIL "no samples in 40 s: $(head -c 300 "$STATE/cupti_err.txt")"
fi
"${CTL[@]}" profile --status
"${CTL[@]}" profile --pause --gpu "$GPU" --for 120s --reason "ncu (metrics.sh)"
sleep 1
grep -q '"paused":true' "$STATE/cupti.jsonl" && check "the watcher is told of the pause" PASS || check "the watcher is told of the pause" FAIL
if run_ncu paused; then check "ncu works after profile --pause (sampler preempted)" PASS
else check "ncu works after profile --pause (sampler preempted)" FAIL "$(grep -m1 '==ERROR==' "$STATE/ncu_paused.txt")"; fi
"${CTL[@]}" profile --resume --gpu "$GPU"
kill "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null; WPID=
sleep 2
holder=$("${CTL[@]}" --json profile --status | $PY -c "import json,sys; r=[x for x in json.load(sys.stdin) if x['device']==$GPU]; print((r[0].get('holder') or {}).get('holder_kind','none') if r else '?')")
[ "$holder" = none ] && check "the sampler lets go when its last watcher leaves" PASS || check "the sampler lets go when its last watcher leaves" FAIL "holder $holder"
stop_daemon

# ---------------------------------------------------------------- 5. overhead and daemon CPU
CLK=$(getconf CLK_TCK)
NGPU=$(grep -c '^GPU ' "$STATE/smi.txt"); [ "$NGPU" -ge 1 ] || NGPU=1
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
rm -f "$STATE/mm_stop" "$STATE/windows" "$STATE/cpu_1s" "$STATE/cpu_100ms"
CUDA_VISIBLE_DEVICES=$GPU $PY "$HERE/mm_windows.py" run "$STATE/mm_log" "$STATE/mm_stop" 500 &
MMPID=$!
for _ in $(seq 300); do [ -s "$STATE/mm_log" ] && [ "$(wc -l <"$STATE/mm_log")" -ge 3 ] && break; sleep 0.1; done
sleep 2
window() { # label → appends "LABEL T0 T1"
  local t0 t1; t0=$(date +%s.%N); sleep "$WINDOW_S"; t1=$(date +%s.%N); echo "$1 $t0 $t1" >>"$STATE/windows"
}
on_window() { # label config
  start_daemon "$2" "gpuprofd_$1.log" || { echo "daemon did not start"; return; }
  sleep 2  # start-up (NVML init, first GPM sample) outside the window
  local c0 c1 t0 t1; c0=$(cpu_ticks "$DPID"); t0=$(now_ms)
  window "$1"
  c1=$(cpu_ticks "$DPID"); t1=$(now_ms)
  awk -v c="$((c1 - c0))" -v hz="$CLK" -v ms="$((t1 - t0))" -v n="$NGPU" 'BEGIN { printf "%.3f\n", c / hz / (ms / 1000) * 100 / n }' >>"$STATE/cpu_$1"
  stop_daemon
  sleep 1
}
for i in $(seq "$CYCLES"); do
  window off; on_window 1s "$STATE/cfg1s.toml"
  window off; on_window 100ms "$STATE/cfg100ms.toml"
done
window off
touch "$STATE/mm_stop"; wait "$MMPID" 2>/dev/null; MMPID=
$PY "$HERE/mm_windows.py" analyze "$STATE/mm_log" "$STATE/windows" | tee "$STATE/analysis.txt"
for lab in 1s 100ms; do
  med=$(grep -E "^$lab: " "$STATE/analysis.txt" | grep -oE 'median -?[0-9.]+' | awk '{print $2}')
  figure "slowdown with always-on metrics at $lab: median ${med:-?} % over $CYCLES windows (matmul bf16 8192^3, $(nvidia-smi --query-gpu=name --format=csv,noheader -i "$GPU" 2>/dev/null))"
  awk -v v="${med:-999}" 'BEGIN { exit !(v <= 0.1) }' && check "always-on metrics at $lab cost <= 0.1 % of the matmul loop" PASS "${med} %" \
    || check "always-on metrics at $lab cost <= 0.1 % of the matmul loop" FAIL "${med:-?} %"
  cpu=$(sort -n "$STATE/cpu_$lab" 2>/dev/null | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "?" }')
  figure "gpuprofd CPU at $lab: median $cpu % of one core per GPU ($NGPU GPU(s); windows: $(tr '\n' ' ' <"$STATE/cpu_$lab" 2>/dev/null))"
  if [ "$lab" = 1s ]; then
    awk -v v="$cpu" 'BEGIN { exit !(v != "?" && v <= 0.5) }' && check "gpuprofd CPU at 1 s <= 0.5 % of a core per GPU" PASS "$cpu %" \
      || check "gpuprofd CPU at 1 s <= 0.5 % of a core per GPU" FAIL "$cpu %"
  fi
done
