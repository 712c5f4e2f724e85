#!/usr/bin/env bash
# GPU check of `gpuprofctl diff`, on a machine with an NVIDIA GPU and PyTorch: two runs of one
# training step (diff_step.py), the second with its second hidden layer twice as wide, each in a
# session of its own; `gpuprofctl diff A B` must name GEMM and elementwise kernels (the wider
# layer's) as the change, and nothing else above the noise (optimizer kernels, which touch that
# layer's weights, are allowed). Prints the diff and a summary last; logs to $OUT when set.
# Binaries: release builds in .gpu/ (or GPUPROF_BIN).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=diff
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
start_gpuprofd 'log_level = "info"'
STEPS=${STEPS:-200}

run_step() { # WIDTH: a session over one run; prints its id
  local s
  s=$(session_start --exe python3 --name "step-$1")
  GPUPROF_LOG_FILE="$STATE/logs/step_$1.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/diff_step.py" "$1" "$STEPS" >"$STATE/step_$1.txt" 2>&1
  "${CTL[@]}" session stop "$s" >/dev/null
  echo "$s"
}
A=$(run_step 4096)
B=$(run_step 8192)
"${CTL[@]}" diff "$A" "$B" --limit 15 | tee "$STATE/diff.txt"
"${CTL[@]}" --json diff "$A" "$B" >"$STATE/diff.json"
got=$("$PY" - "$STATE/diff.json" <<'PYEOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
ks = d.get("kernels", [])
sig = [k for k in ks if k.get("significant")]
gemm = re.compile(r"gemm|nvjet|cutlass|sm90_xmma|ampere", re.I)
elem = re.compile(r"elementwise|vectorized|gelu|unrolled|reduce", re.I)
optim = re.compile(r"multi_tensor|foreach|sgd|adam", re.I)
g = [k["name"] for k in sig if gemm.search(k["name"])]
e = [k["name"] for k in sig if elem.search(k["name"])]
other = [k["name"] for k in sig if not (gemm.search(k["name"]) or elem.search(k["name"]) or optim.search(k["name"]))]
top = sig[0]["name"] if sig else ""
print(json.dumps({"gemm": len(g), "elementwise": len(e), "other": other[:5], "top": top[:80], "significant": len(sig), "kernels": len(ks)}))
PYEOF
)
echo "$got"
figure "diff of a 4096-wide and an 8192-wide second layer ($STEPS steps each): $got"
pass_if "diff names GEMM kernels as changed" "$(jq_py 'd["gemm"] > 0' <<<"$got" | grep -q True && echo 1)" "$got"
pass_if "diff names elementwise kernels as changed" "$(jq_py 'd["elementwise"] > 0' <<<"$got" | grep -q True && echo 1)" "$got"
pass_if "nothing else above the noise" "$(jq_py 'len(d["other"]) == 0' <<<"$got" | grep -q True && echo 1)" "$got"
