#!/usr/bin/env bash
# GPU check of distributed jobs, on a machine with 2 or more NVIDIA GPUs, CUDA 13 and PyTorch:
# a torchrun DDP job over every GPU (ddp_pc.py) with one rank made slow on purpose (an extra
# 8192^3 matmul each step, SLOW_RANK, default 1), traced whole by `session start --all`.
# Prints and checks:
#   - every rank labelled with its rank in `procs` and `session show`, the launcher marked;
#   - the Perfetto export names each rank's process "rank N · python3";
#   - NCCL kernels on every rank, as many on each (one all-reduce per bucket and step, the
#     same number of steps on every rank);
#   - NCCL collectives as records (NCCL loads the injector as its profiler plugin through
#     NCCL_PROFILER_PLUGIN): per rank, as many all-reduces as ddp_pc.py's comm hook issued and
#     at least its loop's broadcasts, matched across ranks by sequence number, joined to their
#     NCCL kernels;
#   - `job top` names the slow rank the straggler, and the others wait in collectives;
#   - what tracing the job costs: the step time traced / untraced, and traced without NCCL's
#     profiler plugin (COST_MODES, default "off traced noplugin"; medians of REPS, default 3,
#     alternating runs of SECS, default 12, seconds; each torchrun also takes ~12 s to start).
# Writes the first collective rows to $OUT/collectives.txt. Binaries: release builds in .gpu/
# (or GPUPROF_BIN).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=jobtop
# shellcheck source=pc_common.sh
. "$HERE/pc_common.sh"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start_gpuprofd 'log_level = "info"'
NGPU=$(nvidia-smi -L | grep -c '^GPU')
SLOW=${SLOW_RANK:-1}
SECS=${SECS:-12}
REPS=${REPS:-3}
[ "$NGPU" -ge 2 ] || { check "GPUs" FAIL "$NGPU GPU: a job needs 2 or more"; exit 1; }

ddp() { # traced|noplugin|off, output file
  local env=()
  [ "$1" = traced ] && env=(CUDA_INJECTION64_PATH="$INJ" NCCL_PROFILER_PLUGIN="$INJ" GPUPROF_LOG_FILE="$STATE/logs/ddp_$1.log")
  [ "$1" = noplugin ] && env=(CUDA_INJECTION64_PATH="$INJ" GPUPROF_LOG_FILE="$STATE/logs/ddp_$1.log")
  env "${env[@]}" "$PY" -m torch.distributed.run --nproc_per_node="$NGPU" "$HERE/ddp_pc.py" "$SECS" "$SLOW" >"$2" 2>&1
}
step_ms() { grep -oE "DDP rank=$2 .*step_ms=[0-9.]+" "$1" | grep -oE 'step_ms=[0-9.]+' | cut -d= -f2; }

# ---------------------------------------------------------------- the traced job
S=$(session_start --all --name job)
ddp traced "$STATE/job.txt" &
JOB=$!
wait_ranks "$NGPU" 90
sleep 2
"${CTL[@]}" procs >"$STATE/procs_live.txt" 2>&1
"${CTL[@]}" --json procs >"$STATE/procs_live.json" 2>&1
wait $JOB
"${CTL[@]}" session stop "$S" >/dev/null
sleep 2
"${CTL[@]}" session show "$S" >"$STATE/show.txt" 2>&1
"${CTL[@]}" --json session show "$S" >"$STATE/show.json" 2>&1
"${CTL[@]}" job top "$S" >"$STATE/jobtop.txt" 2>&1
"${CTL[@]}" --json job top "$S" >"$STATE/jobtop.json" 2>&1
"${CTL[@]}" export "$S" -o "$STATE/job.pftrace" >/dev/null 2>&1
"${CTL[@]}" --json query "$S" --kind collective --limit 0 >"$STATE/collectives.jsonl" 2>&1
"${CTL[@]}" query "$S" --kind collective --limit 40 >"$STATE/collectives.txt" 2>&1
echo "--- procs (while the job ran)"; cat "$STATE/procs_live.txt"
echo "--- job top"; cat "$STATE/jobtop.txt"
grep -E '^DDP|^COLLS|Error' "$STATE/job.txt" | head -12

labelled=$("$PY" - "$STATE/procs_live.json" "$NGPU" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
procs = d.get("processes", d) if isinstance(d, dict) else d
ranks = sorted(p["rank"] for p in procs if p.get("rank") is not None)
launchers = [p for p in procs if p.get("role") == "launcher"]
print(f"{ranks == list(range(int(sys.argv[2])))} ranks={ranks} launchers={len(launchers)}")
PY
)
pass_if "procs: every rank labelled, the launcher marked" "$(grep -q '^True .*launchers=1$' <<<"$labelled" && echo 1)" "$labelled"
shown=$("$PY" - "$STATE/show.json" "$NGPU" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ranks = sorted(p["rank"] for p in d["processes"] if p.get("rank") is not None)
roles = sorted(p.get("role", "") for p in d["processes"])
print(f"{ranks == list(range(int(sys.argv[2])))} ranks={ranks} roles={roles}")
PY
)
pass_if "session show gives every member's rank, the launcher's role" "$(grep -q "^True .*'launcher'" <<<"$shown" && echo 1)" "$shown"
names=$("$PY" - "$STATE/job.pftrace" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
import re
print(" ".join(sorted(set(m.decode() for m in re.findall(rb"rank [0-9]+ \xc2\xb7 [a-z0-9.]+", data)))))
PY
)
pass_if "Perfetto: each rank's process named by its rank" "$(for r in $(seq 0 $((NGPU - 1))); do grep -q "rank $r · " <<<"$names" || exit; done && echo 1)" "$names"

res=$("$PY" - "$STATE/jobtop.json" "$SLOW" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
slow = int(sys.argv[2])
ranks = {r["rank"]: r for r in d["ranks"] if r.get("rank") is not None}
nccl = [ranks[k]["nccl_count"] for k in sorted(ranks)]
waits = {k: ranks[k]["wait_ns"] / 1e6 for k in sorted(ranks)}
st = d.get("straggler") or {}
print(f"straggler={st.get('rank')} nccl={nccl} equal={len(set(nccl)) == 1 and nccl[0] > 0} "
      f"others_wait_ms={sum(w for k, w in waits.items() if k != slow):.1f} slow_wait_ms={waits.get(slow, 0):.1f} "
      f"collectives={d.get('collectives')} evidence={st.get('evidence', d.get('no_straggler'))!r}")
PY
)
echo "$res"
pass_if "NCCL kernels on every rank, as many on each" "$(grep -q 'equal=True' <<<"$res" && echo 1)" "$(grep -oE 'nccl=\[[0-9, ]*\]' <<<"$res")"
pass_if "job top names rank $SLOW the straggler" "$(grep -q "^straggler=$SLOW " <<<"$res" && echo 1)" "$res"
pass_if "the other ranks wait in collectives more than the slow one" \
  "$("$PY" -c "import re,sys; s=sys.argv[1]; o=float(re.search(r'others_wait_ms=([0-9.]+)',s)[1]); w=float(re.search(r'slow_wait_ms=([0-9.]+)',s)[1]); print(1 if o > w else 0)" "$res")" \
  "$(grep -oE 'others_wait_ms=[0-9.]+ slow_wait_ms=[0-9.]+' <<<"$res")"

# NCCL collectives as records: per rank as issued, matched by sequence, joined to kernels.
colls=$("$PY" - "$STATE/jobtop.json" "$STATE/job.txt" "$STATE/collectives.jsonl" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
issued = {}
for m in re.finditer(r"^COLLS rank=(\d+) (.*)$", open(sys.argv[2]).read(), re.M):
    issued[int(m[1])] = {k: int(v) for k, v in (kv.split("=") for kv in m[2].split())}
ok, parts = bool(issued), []
for r in d["ranks"]:
    if r.get("rank") is None:
        continue
    got = {c["name"]: c["count"] for c in r.get("collectives", [])}
    want = issued.get(r["rank"], {})
    good = got.get("AllReduce") == want.get("AllReduce") and got.get("Broadcast", 0) >= want.get("Broadcast", 1)
    ok &= good
    parts.append(f"rank {r['rank']}: recorded {got} issued {want}")
rows = [json.loads(l) for l in open(sys.argv[3]) if l.startswith("{")]
joined = sum(1 for r in rows if r.get("kernel_correlation_id"))
timed = sum(1 for r in rows if r.get("gpu"))
unjoined = [f"{r.get('name')}#{r.get('seq')} proc {r.get('process_id')}" for r in rows if not r.get("kernel_correlation_id")]
print(f"ok={ok} matched_by={d.get('matched_by')} rows={len(rows)} joined={joined} timed={timed} | " + "; ".join(parts)
      + (f" | not joined: {', '.join(unjoined[:6])}" if unjoined else ""))
PY
)
echo "$colls"
pass_if "NCCL collectives recorded per rank as the script issued them" "$(grep -q '^ok=True' <<<"$colls" && echo 1)" "$colls"
pass_if "collectives matched across ranks by sequence number" "$(grep -q 'matched_by=sequence' <<<"$colls" && echo 1)" "$(grep -oE 'matched_by=[a-z ]+' <<<"$colls")"
pass_if "every collective joined to its NCCL kernel" \
  "$("$PY" -c "import re,sys; s=sys.argv[1]; n=int(re.search(r'rows=(\d+)',s)[1]); j=int(re.search(r'joined=(\d+)',s)[1]); print(1 if n > 0 and j == n else 0)" "$colls")" \
  "$(grep -oE 'rows=[0-9]+ joined=[0-9]+ timed=[0-9]+' <<<"$colls")"
echo "--- collectives (first rows)"; head -8 "$STATE/collectives.txt"

# ---------------------------------------------------------------- cost
# COST_MODES: untraced (off), traced with NCCL's profiler plugin (traced, the default), and
# traced without the plugin (noplugin: what the collectives themselves cost).
declare -A T
MODES=${COST_MODES:-off traced noplugin}
for r in $(seq "$REPS"); do
  line="rep $r (rank 0 step ms):"
  for mode in $MODES; do
    s=; [ "$mode" != off ] && s=$(session_start --all --name "cost-$mode-$r")
    ddp "$mode" "$STATE/cost_${mode}_$r.txt"
    [ -n "$s" ] && "${CTL[@]}" session stop "$s" >/dev/null
    T[$mode]="${T[$mode]:-} $(step_ms "$STATE/cost_${mode}_$r.txt" 0)"
    line="$line $mode ${T[$mode]}"
  done
  echo "$line"
done
off=$(echo "${T[off]}" | median)
fl="DDP on $NGPU GPUs, rank $SLOW slowed, rank 0 step ms medians of $REPS: untraced $off"
for mode in $MODES; do
  [ "$mode" = off ] && continue
  on=$(echo "${T[$mode]}" | median)
  fl="$fl, $mode $on ($(calc "($on / $off - 1) * 100") %)"
done
figure "$fl"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$STATE/collectives.txt" "$STATE/jobtop.txt" "$STATE/jobtop.json" "$STATE/procs_live.txt" "$OUT/" 2>/dev/null
fi
