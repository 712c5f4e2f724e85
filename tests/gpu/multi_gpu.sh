#!/usr/bin/env bash
# GPU check of a torchrun DDP job on a machine with 2 or more NVIDIA GPUs (every GPU used), CUDA 13,
# PyTorch and ncu. One summary (CHECK and FIGURE lines) for all of it; logs to $OUT when set.
# Parts (PARTS, default "ddptrace pause jobtop crash"):
#   ddptrace  the job running with the injector in it, traced late by its launcher's pid
#             (`trace --pid L --pc-sampling --duration 10s`): every rank sampled on its own GPU,
#             the launcher not, `pc top` names each rank's hottest kernels (pc_sched.sh ddptrace);
#   pause     the job under `session start --all --pc-sampling`, GPU 1 paused for PAUSE_SECS
#             (default 10) midway: rank 0 keeps being sampled during the pause, rank 1 is not and
#             resumes after it, and ncu profiles a kernel on GPU 1 while it is paused;
#   jobtop    tests/gpu/job_top.sh: ranks, collectives matched by sequence, the straggler named, the
#             cost of tracing the job with and without NCCL's profiler plugin;
#   crash     one rank killed with SIGKILL midway: gpuprofd keeps the other ranks' records, and the
#             session says how the killed rank ended.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=multigpu
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PARTS=" ${PARTS:-ddptrace pause jobtop crash} "
NGPU=$(nvidia-smi -L | grep -c '^GPU')
[ "$NGPU" -ge 2 ] || { check "GPUs" FAIL "$NGPU GPU: this check needs 2 or more"; exit 1; }

# The other scripts' checks, folded into this summary (each runs its own gpuprofd: they run
# before this script starts its own, so that only one holds the GPUs' performance monitors).
fold() { # NAME SCRIPT [ENV...]: runs the script, keeps its CHECK and FIGURE lines
  local name=$1 script=$2; shift 2
  env "$@" GPUPROF_BIN="$BIN" "$HERE/$script" >"$STATE/$name.txt" 2>&1
  while IFS= read -r l; do
    case "$l" in
      "CHECK "*) SUMMARY+=("$name: $l") ;;
      "FIGURE "*) SUMMARY+=("$name: $l") ;;
    esac
  done < <(sed -n '/summary =====/,$p' "$STATE/$name.txt")
  echo "--- $name"; tail -15 "$STATE/$name.txt"
}
# Samples of pid $2 on device $3 in session $1.
samples_on() { samples_of "$1" | grep -E "^$2:$3:" | cut -d: -f3 | awk '{s+=$1} END {print s+0}'; }
rank_pid() { grep -oE "RANKPID rank=$2 pid=[0-9]+" "$1" | grep -oE '[0-9]+$'; }

if [[ $PARTS == *" ddptrace "* ]]; then
  fold ddptrace pc_sched.sh PARTS=ddptrace
fi
if [[ $PARTS == *" jobtop "* ]]; then
  fold jobtop job_top.sh
fi

start_gpuprofd 'log_level = "info"'

# ---------------------------------------------------------------- pause
if [[ $PARTS == *" pause "* ]]; then
  P=${PAUSE_SECS:-10}
  S=$(session_start --all --pc-sampling --name pause)
  GPUPROF_LOG_FILE="$STATE/logs/pause.log" CUDA_INJECTION64_PATH="$INJ" "$PY" -m torch.distributed.run \
    --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" $((P + 30)) >"$STATE/pause_job.txt" 2>&1 &
  J=$!
  wait_ranks "$NGPU" 60
  sleep 8
  r0=$(rank_pid "$STATE/pause_job.txt" 0); r1=$(rank_pid "$STATE/pause_job.txt" 1)
  a0=$(samples_on "$S" "$r0" 0); a1=$(samples_on "$S" "$r1" 1)
  "${CTL[@]}" profile --pause --gpu 1 --reason "ncu on GPU 1" >/dev/null
  sleep 2
  b0=$(samples_on "$S" "$r0" 0); b1=$(samples_on "$S" "$r1" 1)
  cat >"$STATE/k.cu" <<'EOF'
#include <cstdio>
__global__ void gpuprof_probe(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = p[i] * 2.0f + 1.0f; }
int main() { float *d; int n = 1 << 20; cudaMalloc(&d, n * 4); gpuprof_probe<<<n / 256, 256>>>(d, n); cudaError_t e = cudaDeviceSynchronize(); printf("kernel: %s\n", cudaGetErrorString(e)); return e != cudaSuccess; }
EOF
  nvcc -O2 -o "$STATE/k" "$STATE/k.cu" >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 120 ncu --target-processes all -c 1 --section SpeedOfLight "$STATE/k" >"$STATE/ncu_paused.txt" 2>&1
  nrc=$?
  sleep $((P > 6 ? P - 4 : 2))
  c0=$(samples_on "$S" "$r0" 0); c1=$(samples_on "$S" "$r1" 1)
  "${CTL[@]}" profile --resume --gpu 1 >/dev/null
  sleep 14
  d1=$(samples_on "$S" "$r1" 1)
  wait $J
  "${CTL[@]}" session stop "$S" >/dev/null
  figure "pause: rank 0 (GPU 0) samples $a0 -> $b0 -> $c0 during the pause; rank 1 (GPU 1) $a1 -> $b1 -> $c1 during, $d1 after the resume"
  pass_if "pause: rank 0 keeps being sampled while GPU 1 is paused" "$([ "$c0" -gt "$b0" ] && echo 1)" "$b0 -> $c0"
  pass_if "pause: rank 1 is not sampled while GPU 1 is paused" "$([ "$c1" = "$b1" ] && echo 1)" "$b1 -> $c1"
  pass_if "pause: rank 1 is sampled again after the resume" "$([ "$d1" -gt "$c1" ] && echo 1)" "$c1 -> $d1"
  pass_if "pause: ncu profiles a kernel on GPU 1 while it is paused" \
    "$([ $nrc -eq 0 ] && ! grep -q '==ERROR==' "$STATE/ncu_paused.txt" && grep -qE 'Duration|Speed Of Light' "$STATE/ncu_paused.txt" && echo 1)" \
    "rc $nrc $(grep -m1 '==ERROR==' "$STATE/ncu_paused.txt")"
fi

# ---------------------------------------------------------------- crash
if [[ $PARTS == *" crash "* ]]; then
  S=$(session_start --all --name crash)
  GPUPROF_LOG_FILE="$STATE/logs/crash.log" CUDA_INJECTION64_PATH="$INJ" "$PY" -m torch.distributed.run \
    --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" 30 >"$STATE/crash_job.txt" 2>&1 &
  J=$!
  wait_ranks "$NGPU" 60
  sleep 8
  victim=$(rank_pid "$STATE/crash_job.txt" $((NGPU - 1)))
  kill -9 "$victim"
  wait $J
  jrc=$?
  sleep 2
  "${CTL[@]}" session stop "$S" >/dev/null
  "${CTL[@]}" --json session show "$S" >"$STATE/crash_show.json"
  "${CTL[@]}" session show "$S" | tail -12
  got=$("$PY" - "$STATE/crash_show.json" "$victim" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); victim = int(sys.argv[2])
procs = d.get("processes", [])
others = [p for p in procs if p.get("pid") != victim and p.get("rank") is not None]
dead = [p for p in procs if p.get("pid") == victim]
kept = sum(1 for p in others if p.get("kernels", 0) > 0)
ended = " ".join(str(p.get(k, "")) for p in dead for k in ("state", "detail", "exit"))
print(f"{kept} {len(others)} {json.dumps(ended)}")
EOF
)
  read -r kept others ended <<<"$got"
  figure "crash: rank $((NGPU - 1)) (pid $victim) killed; job exit $jrc; ranks with their kernels kept $kept of $others; the killed rank: $ended"
  pass_if "crash: the other ranks' records are kept" "$([ "${kept:-0}" -ge 1 ] && [ "$kept" = "$others" ] && echo 1)" "$kept of $others"
  pass_if "crash: the session says how the killed rank ended" "$(grep -qiE 'kill|signal|lost|gone|disconnect' <<<"$ended" && echo 1)" "$ended"
fi
