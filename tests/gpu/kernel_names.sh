#!/usr/bin/env bash
# GPU check of kernel names, on a machine with NVIDIA GPUs, CUDA 13, PyTorch and transformers:
# a conv-net training step, a transformers Llama training step, a torch.compile'd function
# (Triton) (name_workloads.py) and a DDP job over every GPU (ddp_pc.py under torchrun), each
# traced by gpuprof; the first three also run under torch.profiler without the injector.
# Prints and checks:
#   - every distinct kernel name gpuprof stored is shown as c++filt writes it (names c++filt
#     cannot demangle: as gpuprof's own demangler writes them, counted apart);
#   - per workload, every kernel name torch.profiler shows is one gpuprof shows, or its mangled
#     form where torch.profiler shows that (the same steps ran under both, after the same
#     warm-up), and the share of gpuprof's launches whose name torch.profiler shows.
# Writes the distinct mangled names to $OUT/kernel_names_harvest.txt, for
# tests/fixtures/kernel_names.txt. Binaries: release builds in .gpu/ (or GPUPROF_BIN).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=kernelnames
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start_gpuprofd 'log_level = "info"'
NGPU=$(nvidia-smi -L | grep -c '^GPU')

declare -A SID
for w in conv llama compile; do
  "$PY" "$HERE/name_workloads.py" "$w" "$STATE/tp_$w.txt" >"$STATE/tp_$w.log" 2>&1 || tail -5 "$STATE/tp_$w.log"
  SID[$w]=$(session_start --exe python3 --name "names-$w")
  GPUPROF_LOG_FILE="$STATE/logs/$w.log" CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/name_workloads.py" "$w" \
    >"$STATE/gp_$w.log" 2>&1 || tail -5 "$STATE/gp_$w.log"
  "${CTL[@]}" session stop "${SID[$w]}" >/dev/null
done
SID[ddp]=$(session_start --all --name names-ddp)
GPUPROF_LOG_FILE="$STATE/logs/ddp.log" CUDA_INJECTION64_PATH="$INJ" "$PY" -m torch.distributed.run \
  --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" 4 >"$STATE/gp_ddp.log" 2>&1 || tail -5 "$STATE/gp_ddp.log"
"${CTL[@]}" session stop "${SID[ddp]}" >/dev/null
sleep 2

# The daemon's database: each session's kernel names (mangled as stored, shown as gpuprof
# shows them) with their launch counts.
for w in conv llama compile ddp; do
  "$PY" - "$STATE/gpuprof.db" "${SID[$w]}" >"$STATE/gpn_$w.txt" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
for value, shown, n in db.execute(
        "SELECT s.value, COALESCE(s.demangled, s.value), count(*) FROM kernel k JOIN strings s ON s.id = k.name "
        "WHERE k.session = ? GROUP BY s.id", (int(sys.argv[2]),)):
    print(f"{n}\t{value}\t{shown}")
PY
  echo "--- $w: $(wc -l <"$STATE/gpn_$w.txt") distinct kernel names, $(awk -F'\t' '{s+=$1} END {print s+0}' "$STATE/gpn_$w.txt") launches"
done

# Every distinct name against c++filt.
cat "$STATE"/gpn_*.txt | cut -f2,3 | sort -u >"$STATE/all_names.txt"
cut -f1 "$STATE/all_names.txt" | sort -u >"$STATE/harvest.txt"
"$PY" - "$STATE/all_names.txt" >"$STATE/cxxfilt_cmp.txt" <<'PY'
import subprocess, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if "\t" in l]
filt = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows) + "\n", capture_output=True, text=True).stdout.splitlines()
same = differ = own = plain = 0
for (mangled, shown), f in zip(rows, filt):
    if not mangled.startswith("_Z"):
        plain += 1
    elif f == mangled:
        own += 1  # c++filt cannot demangle it: gpuprof keeps its own form
    elif f == shown:
        same += 1
    else:
        differ += 1
        print(f"DIFFER\t{mangled}\n  c++filt: {f}\n  gpuprof: {shown}")
print(f"RESULT mangled_same={same} differ={differ} cxxfilt_cannot={own} not_mangled={plain}")
PY
grep DIFFER -A 2 "$STATE/cxxfilt_cmp.txt" | head -12
r=$(grep '^RESULT' "$STATE/cxxfilt_cmp.txt")
pass_if "every kernel name gpuprof stored is shown as c++filt writes it" \
  "$(grep -q 'differ=0 ' <<<"$r" && ! grep -q 'mangled_same=0 ' <<<"$r" && echo 1)" "$r"

# Per workload against torch.profiler.
for w in conv llama compile; do
  [ -s "$STATE/tp_$w.txt" ] || { check "$w: torch.profiler names" FAIL "torch.profiler run failed: $(tail -1 "$STATE/tp_$w.log")"; continue; }
  res=$("$PY" - "$STATE/tp_$w.txt" "$STATE/gpn_$w.txt" <<'PY'
import sys
tp = {l.rstrip("\n").split("\t", 1)[1] for l in open(sys.argv[1]) if "\t" in l}
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
gp = {shown for _, _, shown in rows}
mangled = {value for _, value, _ in rows}
# A name torch.profiler shows mangled (c++filt cannot demangle it) is found by that form too;
# gpuprof shows its own demangling of it.
missing = sorted(t for t in tp if t not in gp and t not in mangled)
for m in missing[:3]:
    print(f"  only torch.profiler: {m}", file=sys.stderr)
hit = sum(int(n) for n, value, shown in rows if shown in tp or value in tp)
print(f"{len(tp) - len(missing)}/{len(tp)} {hit}/{sum(int(n) for n, _, _ in rows)}")
PY
)
  names=${res%% *}; launches=${res##* }
  pass_if "$w: every kernel name torch.profiler shows is one gpuprof shows" "$([ "${names%%/*}" = "${names##*/}" ] && [ "${names##*/}" -gt 0 ] && echo 1)" \
    "$names names; launches of gpuprof named as torch.profiler names them: $launches"
done
nccl=$(grep -c 'nccl' "$STATE/gpn_ddp.txt")
pass_if "DDP on $NGPU GPUs: NCCL kernels among the names" "$([ "$nccl" -gt 0 ] && echo 1)" "$nccl NCCL names"
figure "$(wc -l <"$STATE/harvest.txt") distinct kernel names harvested"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$STATE/harvest.txt" "$OUT/kernel_names_harvest.txt"
  cp "$STATE/cxxfilt_cmp.txt" "$OUT/kernel_names_cxxfilt.txt"
fi
