#!/usr/bin/env bash
# GPU checks of the injector (libgpuprof_inject.so) with the real gpuprofd, on a machine with an
# NVIDIA GPU (H100/H200), CUDA 13 (nvcc, libcupti) and PyTorch (`python3`). Scenarios (pick with
# SCENARIOS="..."; default all, in this order):
#   nodaemon  the CUDA program and the PyTorch program keep their exit codes with the injector
#             loaded (CUDA_INJECTION64_PATH and LD_PRELOAD) and no daemon listening;
#   count     a CUDA C program launching `gpuprof_named_kernel` exactly M times gives exactly M
#             kernel rows, once under CUDA_INJECTION64_PATH and once under LD_PRELOAD;
#   matmul    PyTorch: exactly 100 bf16 8192x8192 matmuls and copies of known sizes; the stored
#             trace has the 100 GEMM kernels, the copies with their byte counts, and every GEMM
#             joined to its launch API record by correlation id; its Chrome export has every
#             kernel, the GEMMs each at the end of a launch flow from an API call;
#   nvtx      PyTorch NVTX ranges and marks (NVTX_INJECTION64_PATH): exactly the ranges pushed and
#             the marks made are stored, with their names;
#   coexist   torch.profiler inside an injected process still records (>= 90% of) its CUDA
#             events and the daemon reports the process as displaced, both when gpuprof traces
#             first (late) and when torch.profiler ran first (early);
#   attach    late attach and external correlation: a CUDA program (tests/gpu/attach.cu) creates
#             its context and a stream and runs kernels untraced; then a session starts (full
#             preset); the N kernels it launches afterwards are stored exactly, with context and
#             stream records for the context and stream created before the trace, and each of
#             the N kernels tagged with an external correlation id is joined to its id, and every
#             kernel to its launch API record;
#   afterstop a PyTorch process started while a session was active (so API recording was
#             switched on inside cuInit) runs at untraced speed once the session stopped;
#   overhead  200k empty launches and a PyTorch loop of 100k small kernels: untraced,
#             injected-but-idle, traced by gpuprof (kernels only, default preset, full preset),
#             the raw-CUPTI floors, torch.profiler; ratios from this one run, plus records
#             stored and dropped while traced. "traced" starts each session before its process
#             (with API_FROM_START=1, the default here, API callback ids on from cuInit); "late"
#             records API calls as for a process started before its session.
# Prints CHECK/FIGURE lines and a summary last; copies logs to $OUT when set.
#
# Binaries: release builds in .gpu/ (or GPUPROF_BIN), from a build machine:
#   cargo build --release -p gpuprof-inject -p gpuprofd -p gpuprof-sampler -p gpuprofctl
#   mkdir -p .gpu && cp target/release/{gpuprofd,gpuprof-sampler,gpuprofctl,libgpuprof_inject.so} .gpu/ && strip .gpu/*
# then `bash tests/gpu/injector.sh` on the GPU machine with .gpu carried.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GPUPROF_BIN:-$PWD/.gpu}
INJ=$BIN/libgpuprof_inject.so
OUTDIR=${OUT:-}
PY=${PYTHON:-python3}
SCENARIOS=${SCENARIOS:-nodaemon count matmul nvtx coexist attach afterstop overhead}
REPS=${REPS:-3}
# The daemon's agent.api_from_start (1, gpuprofd's default: sessions let processes they trace
# from their start record API calls by callback id from cuInit; 0: by activity kind).
API_FROM_START=${API_FROM_START:-1}
[ "$API_FROM_START" = 1 ] && API_FROM_START=true || API_FROM_START=false
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
STATE=$(mktemp -d /tmp/gpuprof-inj.XXXXXX)
CTL=("$BIN/gpuprofctl" --socket "$STATE/api.sock")
SUMMARY=()
FIGURES=()
DPID=
check() { SUMMARY+=("CHECK $1: $2${3:+ ($3)}"); echo ">>> CHECK $1: $2${3:+ ($3)}"; }
figure() { FIGURES+=("FIGURE $1"); echo ">>> FIGURE $1"; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
pass_if() { if [ "$2" = 1 ]; then check "$1" PASS "$3"; else check "$1" FAIL "$3"; fi; }

finish() {
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp "$STATE/gpuprofd.log" "$OUTDIR/injector_gpuprofd.log" 2>/dev/null
    cat "$STATE"/run_*.log >"$OUTDIR/injector_runs.log" 2>/dev/null
  fi
  echo
  echo "================ injector summary ================"
  nvidia-smi -L 2>/dev/null | head -2
  printf '%s\n' "${SUMMARY[@]}" "${FIGURES[@]}"
  local failed=0
  for l in "${SUMMARY[@]}"; do case "$l" in *": FAIL"*) failed=$((failed + 1)) ;; esac; done
  echo "$((${#SUMMARY[@]} - failed)) passed, $failed failed"
  # The exit status says whether every check passed (a check that failed: 1).
  [ "$failed" -eq 0 ] || exit 1
}
trap finish EXIT

[ -e "$INJ" ] && [ -x "$BIN/gpuprofd" ] && [ -x "$BIN/gpuprofctl" ] || { echo "binaries missing in $BIN"; exit 2; }
nvidia-smi -L

# ---------------------------------------------------------------- build the workloads
nvcc -O2 -arch=sm_90 -o "$STATE/launch_count" "$HERE/launch_count.cu" || exit 2
nvcc -O2 -arch=sm_90 -o "$STATE/bench_launch" "$HERE/bench_launch.cu" || exit 2
nvcc -O2 -arch=sm_90 -I/usr/local/cuda/include -o "$STATE/attach" "$HERE/attach.cu" -L/usr/local/cuda/lib64 -lcupti || exit 2
gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o "$STATE/libfloor.so" "$HERE/anchors/floor_inj.c" \
  -L/usr/local/cuda/lib64 -lcupti || exit 2
gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o "$STATE/libfloor_min.so" "$HERE/floor_min.c" \
  -L/usr/local/cuda/lib64 -lcupti || exit 2

start_daemon() {
  printf 'log_level = "info"\n[agent]\napi_from_start = %s\n[sampler]\nenabled = false\n' "$API_FROM_START" >"$STATE/cfg.toml"
  "$BIN/gpuprofd" --state-dir "$STATE" --config "$STATE/cfg.toml" >"$STATE/gpuprofd.log" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$STATE/api.sock" ] && "${CTL[@]}" status >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "gpuprofd did not start"; tail -20 "$STATE/gpuprofd.log"; exit 2
}
# Starts a session over every process (one process joins one session) and prints its id.
session_start() { "${CTL[@]}" --json session start --all "$@" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
# Stops a session, then waits until what the process sent is committed: the daemon's ingest
# queue is empty and the session's stored kernel count has not changed for two looks.
session_stop() {
  "${CTL[@]}" session stop "$1" >/dev/null
  local prev=-1 cur q same=0
  for _ in $(seq 50); do
    sleep 0.2
    q=$("${CTL[@]}" --json status 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["ingest_queue_depth"])' 2>/dev/null)
    cur=$("${CTL[@]}" --json top "$1" 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["kernel_count"])' 2>/dev/null)
    if [ "$q" = 0 ] && [ "$cur" = "$prev" ]; then same=$((same + 1)); else same=0; fi
    [ $same -ge 2 ] && return 0
    prev=$cur
  done
}
records() { "${CTL[@]}" --json query "$1" --kind "$2" --limit 100000000; }

# ---------------------------------------------------------------- nodaemon
if [[ " $SCENARIOS " == *" nodaemon "* ]]; then
  export GPUPROF_AGENT_SOCKET=$STATE/absent.sock
  for mode in plain inject preload; do
    case $mode in
      plain) env=() ;;
      inject) env=(CUDA_INJECTION64_PATH="$INJ") ;;
      preload) env=(LD_PRELOAD="$INJ") ;;
    esac
    t0=$(date +%s.%N)
    env "${env[@]}" "$STATE/launch_count" 5000 3 0 >>"$STATE/run_nodaemon.log" 2>&1; rc_c=$?
    t1=$(date +%s.%N)
    env "${env[@]}" "$PY" "$HERE/matmul.py" 4 0 >>"$STATE/run_nodaemon.log" 2>&1; rc_p=$?
    t2=$(date +%s.%N)
    pass_if "no daemon, $mode: CUDA program exit code 3" "$([ $rc_c = 3 ] && echo 1)" "got $rc_c, $(calc "$t1 - $t0") s"
    pass_if "no daemon, $mode: PyTorch program exit code 4" "$([ $rc_p = 4 ] && echo 1)" "got $rc_p, $(calc "$t2 - $t1") s"
  done
fi

export GPUPROF_AGENT_SOCKET=$STATE/agent.sock
start_daemon

# ---------------------------------------------------------------- count
if [[ " $SCENARIOS " == *" count "* ]]; then
  for mode in inject preload; do
    m=$([ $mode = inject ] && echo 1000 || echo 1234)
    s=$(session_start --preset default --name "count-$mode")
    if [ $mode = inject ]; then envs=(CUDA_INJECTION64_PATH="$INJ"); else envs=(LD_PRELOAD="$INJ"); fi
    env "${envs[@]}" GPUPROF_LOG=info "$STATE/launch_count" $m 0 1500 >>"$STATE/run_count.log" 2>&1; rc=$?
    session_stop "$s"
    if [ $rc -ge 128 ] && command -v cuda-gdb >/dev/null; then # a crash: where?
      s2=$(session_start --preset default --name "count-$mode-gdb")
      env "${envs[@]}" timeout 120 cuda-gdb -q -batch -ex run -ex bt -ex "info threads" -ex "thread apply all bt 8" \
        --args "$STATE/launch_count" 100 0 1500 2>&1 | tail -60 | tee -a "$STATE/run_count.log"
      session_stop "$s2"
    fi
    n=$(records "$s" kernel | grep -c gpuprof_named_kernel)
    other=$(records "$s" kernel | grep -vc gpuprof_named_kernel)
    pass_if "$mode: exactly M=$m kernel rows of gpuprof_named_kernel" "$([ "$n" = "$m" ] && [ $rc = 0 ] && echo 1)" \
      "rows $n, other kernels $other, exit $rc"
  done
fi

# ---------------------------------------------------------------- matmul
if [[ " $SCENARIOS " == *" matmul "* ]]; then
  s=$(session_start --preset full --name matmul)
  # MATMUL_SKIP: parts the injector leaves out (GPUPROF_TRACE_SKIP), e.g. runtime_api to see the
  # GEMMs joined to driver API records instead.
  CUDA_INJECTION64_PATH="$INJ" GPUPROF_TRACE_SKIP="${MATMUL_SKIP:-}" "$PY" "$HERE/matmul.py" 0 2.0 >>"$STATE/run_matmul.log" 2>&1; rc=$?
  session_stop "$s"
  "${CTL[@]}" top "$s" --top 5 | tee -a "$STATE/run_matmul.log"
  records "$s" kernel,memcpy,api >"$STATE/matmul.jsonl"
  "$PY" - "$STATE/matmul.jsonl" <<'EOF' | tee "$STATE/matmul.check"
import json, re, sys, collections
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
k = [r for r in recs if r["kind"] == "kernel"]
gemm = [r for r in k if re.search(r"gemm|nvjet|xmma|cutlass|sm90_", r["name"], re.I)]
names = collections.Counter(r["name"][:70] for r in gemm)
api = {r["correlation_id"]: r for r in recs if r["kind"] == "api"}
joined = [g for g in gemm if g["correlation_id"] in api]
via = collections.Counter(api[g["correlation_id"]]["name"] for g in joined)
cp = collections.Counter((r["direction"], r["bytes"]) for r in recs if r["kind"] == "memcpy")
want = [("HtoD", 4194304), ("HtoD", 67108864), ("DtoH", 268435456)]
found = [w for w in want if cp.get(w)]
print(f"gemm_kernels={len(gemm)} joined={len(joined)} kernels_total={len(k)} api_records={len(api)}")
print(f"gemm_names={dict(names)} launch_api={dict(via)}")
print(f"copies={dict(cp)} known_copies_found={len(found)}/3 {found}")
print("RESULT", "ok" if len(gemm) == 100 and len(joined) == 100 and len(found) == 3 else "bad")
EOF
  res=$(grep -c "RESULT ok" "$STATE/matmul.check")
  pass_if "PyTorch: 100 GEMM kernels, all joined to their launch API record, 3 known copies" "$res" \
    "$(head -1 "$STATE/matmul.check"); $(sed -n 3p "$STATE/matmul.check"); exit $rc"
  # The same session as a Chrome trace: every stored kernel an event, the 100 GEMMs among them,
  # each the end of a launch flow that starts at an API call of its process.
  "${CTL[@]}" export "$s" --format chrome -o "$STATE/matmul.json" | tee -a "$STATE/run_matmul.log"
  "$PY" - "$STATE/matmul.jsonl" "$STATE/matmul.json" <<'EOF' | tee "$STATE/matmul_export.check"
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
kernels = sum(1 for r in recs if r["kind"] == "kernel")
ev = json.load(open(sys.argv[2]))["traceEvents"]
k = [e for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X"]
gemm = [e for e in k if re.search(r"gemm|nvjet|xmma|cutlass|sm90_", e["name"], re.I)]
starts = {(e["pid"] // 1000, e["id"]) for e in ev if e.get("ph") == "s"}
ends = {(e["pid"], e["tid"], e["ts"]): e["id"] for e in ev if e.get("ph") == "f"}
flowed = [g for g in gemm if (g["pid"] // 1000, ends.get((g["pid"], g["tid"], g["ts"]))) in starts]
print(f"chrome kernel_events={len(k)} stored_kernels={kernels} gemm_events={len(gemm)} gemm_with_launch_flow={len(flowed)}")
print("RESULT", "ok" if len(k) == kernels and len(gemm) == 100 and len(flowed) == 100 else "bad")
EOF
  res=$(grep -c "RESULT ok" "$STATE/matmul_export.check")
  pass_if "PyTorch: the Chrome export has every kernel, the 100 GEMMs each at the end of a launch flow" "$res" \
    "$(head -1 "$STATE/matmul_export.check")"
fi

# ---------------------------------------------------------------- nvtx
if [[ " $SCENARIOS " == *" nvtx "* ]]; then
  s=$(session_start --preset default --name nvtx)
  CUDA_INJECTION64_PATH="$INJ" NVTX_INJECTION64_PATH="$INJ" "$PY" "$HERE/nvtx.py" 50 7 2.0 >>"$STATE/run_nvtx.log" 2>&1; rc=$?
  session_stop "$s"
  records "$s" marker >"$STATE/nvtx.jsonl"
  read -r nr nm <<<"$("$PY" -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = sum(1 for x in recs if x["name"] == "gpuprof_step" and not x["is_mark"] and x["end_ns"] > x["start_ns"])
m = sum(1 for x in recs if x["name"] == "gpuprof_mark" and x["is_mark"])
print(r, m)' "$STATE/nvtx.jsonl")"
  pass_if "NVTX: 50 ranges and 7 marks stored with their names" "$([ "$nr" = 50 ] && [ "$nm" = 7 ] && [ $rc = 0 ] && echo 1)" \
    "ranges $nr, marks $nm, marker rows $(wc -l <"$STATE/nvtx.jsonl"), exit $rc"
fi

# ---------------------------------------------------------------- coexist
# Variants (COEXIST_VARIANTS): late (gpuprof traces when torch.profiler starts), early
# (torch.profiler ran before the trace starts), late_small (late with 128 KiB buffers),
# late_kernels (late, kernels-only preset), alone (no injector: torch.profiler's own count).
COEXIST_VARIANTS=${COEXIST_VARIANTS:-late early}
if [[ " $SCENARIOS " == *" coexist "* ]]; then
  for v in $COEXIST_VARIANTS; do
    preset=default; envs=(CUDA_INJECTION64_PATH="$INJ"); mode=late
    case $v in
      early) mode=early ;;
      late_small) envs+=(GPUPROF_BUFFER_KB=128) ;;
      late_kernels) preset=kernels ;;
      alone) envs=() ;;
    esac
    s=$(session_start --preset $preset --name "coexist-$v")
    env "${envs[@]}" GPUPROF_LOG=info "$PY" "$HERE/coexist.py" $mode >"$STATE/run_coexist_$v.log" 2>&1; rc=$?
    grep -v "_warn_once\|UserWarning" "$STATE/run_coexist_$v.log" | tail -12
    ev=$(grep -oE "mode=$mode torch_profiler_cuda_events=[0-9]+" "$STATE/run_coexist_$v.log" | cut -d= -f3)
    n=$(grep -oE "mode=$mode .*launched=[0-9]+" "$STATE/run_coexist_$v.log" | grep -oE "launched=[0-9]+" | cut -d= -f2)
    session_stop "$s"
    "${CTL[@]}" --json session show "$s" >"$STATE/coexist_$v.json"
    state=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(",".join(p.get("state","?") + ("/displaced" if p.get("displaced") else "") for p in s.get("processes",[])))' "$STATE/coexist_$v.json")
    ours=$(records "$s" kernel | wc -l)
    pass_if "$v: torch.profiler records its CUDA events in an injected process" \
      "$([ "${ev:-0}" -ge "$(( ${n:-1} * 9 / 10 ))" ] && [ $rc = 0 ] && echo 1)" "events ${ev:-none} of ${n:-?} launched, exit $rc"
    [ "$v" = alone ] && continue
    pass_if "$v: daemon reports the process as displaced" "$([[ "$state" == *displaced* ]] && echo 1)" \
      "state $state; gpuprof kernels stored $ours"
  done
fi

# ---------------------------------------------------------------- attach
if [[ " $SCENARIOS " == *" attach "* ]]; then
  N=500
  rm -f "$STATE/attach.ready" "$STATE/attach.go"
  CUDA_INJECTION64_PATH="$INJ" GPUPROF_LOG=info "$STATE/attach" "$STATE/attach.ready" "$STATE/attach.go" $N \
    >"$STATE/run_attach.log" 2>&1 &
  apid=$!
  for _ in $(seq 300); do [ -e "$STATE/attach.ready" ] && break; sleep 0.1; done
  sleep 0.5 # connected and idle: no session yet
  s=$(session_start --preset full --name attach)
  traced=
  for _ in $(seq 100); do
    st=$("${CTL[@]}" --json session show "$s" | "$PY" -c 'import json,sys; print(" ".join(p.get("state","?") for p in json.load(sys.stdin).get("processes",[])))')
    [[ " $st " == *" tracing "* ]] && traced=1 && break
    sleep 0.1
  done
  touch "$STATE/attach.go"
  wait $apid; rc=$?
  session_stop "$s"
  cat "$STATE/run_attach.log" | grep -v "^gpuprof" | tail -3
  res=$("$PY" - "$STATE/gpuprof.db" "$s" "$apid" $N <<'PYEOF'
import sqlite3, sys
db, sess, pid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
proc = c.execute("SELECT id FROM processes WHERE pid=? ORDER BY id DESC LIMIT 1", (pid,)).fetchone()[0]
k = c.execute("SELECT s.value, k.ctx, k.stream, k.corr FROM kernel k JOIN strings s ON s.id = k.name "
              "WHERE k.session=? AND k.proc=?", (sess, proc)).fetchall()
def named(part):  # kernel names are stored as compiled (mangled): match the part
    return [(ctx, stream, corr) for name, ctx, stream, corr in k if part in name]
ext, dflt, warm = named("gpuprof_ext_kernel"), named("gpuprof_default_kernel"), named("gpuprof_warmup_kernel")
ctxs = {r[0] for r in c.execute("SELECT ctx FROM context WHERE session=? AND proc=?", (sess, proc))}
streams = {r[0] for r in c.execute("SELECT stream FROM stream WHERE session=? AND proc=?", (sess, proc))}
api = {r[0] for r in c.execute("SELECT corr FROM api WHERE session=? AND proc=?", (sess, proc))}
api_joined = sum(1 for _, _, corr in ext + dflt if corr in api)
ec = c.execute("SELECT ext_kind, ext_id, corr FROM external_correlation WHERE session=? AND proc=?", (sess, proc)).fetchall()
custom0 = [r for r in ec if r[0] == 3]
by_corr = {r[2]: r[1] for r in custom0}
joined = [by_corr.get(corr) for _, _, corr in ext]
ids_ok = sorted(j for j in joined if j is not None) == list(range(5000, 5000 + n))
dflt_tagged = sum(1 for _, _, corr in dflt if corr in by_corr)
kctx = {x[0] for x in ext + dflt}
kstreams = {x[1] for x in ext + dflt}
print(f"ext_kernels={len(ext)} default_kernels={len(dflt)} warmup_kernels={len(warm)} "
      f"context_rows={len(ctxs)} kernel_contexts_known={kctx <= ctxs} stream_rows={len(streams)} "
      f"kernel_streams={sorted(kstreams)} kernel_streams_known={kstreams <= streams} "
      f"ext_records={len(ec)} custom0={len(custom0)} ext_joined={sum(j is not None for j in joined)} "
      f"ids_exact={ids_ok} default_tagged={dflt_tagged} api_records={len(api)} api_joined={api_joined}")
PYEOF
)
  echo "attach: $res"
  kv() { grep -oE "(^| )$1=[^ ]+" <<<"$res" | cut -d= -f2; }
  pass_if "late attach: the process was idle, then traced by a session started later" "$([ -n "$traced" ] && [ $rc = 0 ] && echo 1)" "exit $rc"
  pass_if "late attach: exactly N=$N kernels on each stream after the start, none from before" \
    "$([ "$(kv ext_kernels)" = $N ] && [ "$(kv default_kernels)" = $N ] && [ "$(kv warmup_kernels)" = 0 ] && echo 1)" \
    "ext $(kv ext_kernels), default $(kv default_kernels), warm-up $(kv warmup_kernels)"
  pass_if "late attach: context and stream records for the context and streams made before the trace" \
    "$([ "$(kv kernel_contexts_known)" = True ] && [ "$(kv kernel_streams_known)" = True ] && [ "$(kv context_rows)" -ge 1 ] \
       && [ "$(kv stream_rows)" -ge 2 ] && echo 1)" \
    "contexts $(kv context_rows), streams $(kv stream_rows), kernel streams $(kv kernel_streams)"
  pass_if "external correlation: each of the N tagged kernels joined to its id 5000+i, untagged ones to none" \
    "$([ "$(kv ext_joined)" = $N ] && [ "$(kv ids_exact)" = True ] && [ "$(kv default_tagged)" = 0 ] && echo 1)" \
    "records $(kv ext_records) (CUSTOM0 $(kv custom0)), joined $(kv ext_joined), default tagged $(kv default_tagged)"
  pass_if "late attach: each of the 2N kernels joined to its launch API record" \
    "$([ "$(kv api_joined)" = $((2 * N)) ] && echo 1)" "api records $(kv api_records), kernels joined $(kv api_joined)"
fi

# ---------------------------------------------------------------- afterstop
# A PyTorch process started while a session was active (API records switched on inside cuInit),
# traced, then the session stops: the rest of its run should cost what an untraced run costs.
if [[ " $SCENARIOS " == *" afterstop "* ]]; then
  declare -A P1 P2
  for rep in 1 2; do
    for mode in none stopped; do
      rm -f "$STATE/ph.ready" "$STATE/ph.go"
      if [ $mode = stopped ]; then
        s=$(session_start --preset default --name afterstop)
        CUDA_INJECTION64_PATH="$INJ" "$PY" "$HERE/phases.py" "$STATE/ph.ready" "$STATE/ph.go" 50000 5 >"$STATE/ph.out" 2>&1 &
      else
        "$PY" "$HERE/phases.py" "$STATE/ph.ready" "$STATE/ph.go" 50000 5 >"$STATE/ph.out" 2>&1 &
      fi
      ppid=$!
      for _ in $(seq 1200); do [ -e "$STATE/ph.ready" ] && break; sleep 0.05; done
      [ $mode = stopped ] && session_stop "$s"
      touch "$STATE/ph.go"
      wait $ppid
      out=$(grep PHASES "$STATE/ph.out")
      echo "afterstop $mode: $out" | tee -a "$STATE/run_afterstop.log"
      P1[$mode]="${P1[$mode]:-} $(grep -oE 'phase1_us=[0-9.]+' <<<"$out" | cut -d= -f2)"
      P2[$mode]="${P2[$mode]:-} $(grep -oE 'phase2_us=[0-9.]+' <<<"$out" | cut -d= -f2)"
    done
  done
  r1=$(calc "$(echo "${P1[stopped]}" | median) / $(echo "${P1[none]}" | median)")
  r2=$(calc "$(echo "${P2[stopped]}" | median) / $(echo "${P2[none]}" | median)")
  figure "afterstop: traced phase ${r1}x untraced (runs:${P1[stopped]} vs${P1[none]}), after the stop ${r2}x (runs:${P2[stopped]} vs${P2[none]})"
  pass_if "after its session stops, a process traced from its start costs <= 1.02x untraced (api_from_start=$API_FROM_START)" \
    "$(calc "$r2 <= 1.02")" "${r2}x"
fi

# ---------------------------------------------------------------- overhead
# Modes: none (no injector), idle (injected, connected, no session), inert (injected with
# GPUPROF_DISABLE=1: the driver's own cost of an injection library), floor (gpu-anchors raw
# CUPTI, every runtime API call), floor_kernel and floor_launch (tests/gpu/floor_min.c: raw
# CUPTI kernel records, and kernel plus launch API records, switched on inside cuInit), kineto
# (torch.profiler), and traced modes, each a daemon preset plus parts the injector
# skips (GPUPROF_TRACE_SKIP): kernels (kernels only), traced (default preset), and for a cost
# breakdown rt_only (kernels + runtime API), drv_only (kernels + driver API), drv (default with
# driver instead of runtime API records), no_rt (default
# without runtime API), full_no_rt (full preset without runtime API and overhead).
LAUNCH_MODES=${LAUNCH_MODES:-none idle inert kernels traced full floor}
TORCH_MODES=${TORCH_MODES:-none idle inert kernels traced full floor kineto}
# rt_sync, rt_ext, rt_nvtx, rt_copy: rt_only plus one part (sync, external correlation, NVTX,
# memcpy+memset); full: the full preset (default plus sync, external correlation, overhead,
# driver API); lean: default without sync and external correlation (the default preset before
# those moved to full).
declare -A PRESET=([kernels]=kernels [traced]=default [full]=full [rt_only]=default [drv_only]=full [drv]=full [no_rt]=default
  [full_no_rt]=full [rt_sync]=default [rt_ext]=default [rt_nvtx]=default [rt_copy]=default [lean]=default)
declare -A SKIP=([rt_only]=memcpy,memset,sync,nvtx,external_correlation,graphs
  [drv_only]=runtime_api,memcpy,memset,sync,overhead,nvtx,external_correlation,graphs
  [no_rt]=runtime_api [full_no_rt]=runtime_api,overhead
  [rt_sync]=memcpy,memset,nvtx,external_correlation,graphs [rt_ext]=memcpy,memset,sync,nvtx,graphs
  [rt_nvtx]=memcpy,memset,sync,external_correlation,graphs [rt_copy]=sync,nvtx,external_correlation,graphs
  [lean]=sync,external_correlation [drv]=runtime_api,sync,external_correlation,overhead,graphs)
# Variants of the default preset (injector environment): nozero (CUPTI zeroes each activity
# buffer itself, on the thread that asks), cbid (API records switched on per callback id only,
# after initialisation: records none when the trace starts after the CUDA runtime initialised),
# late (API records by activity kind, as for a process that started before its session:
# GPUPROF_API_AT_INIT=0 ignores the daemon's new-process hint, GPUPROF_API_HOOK=0 its hook
# line), hooked (as late, but with the runtime hooked inside cuInit, GPUPROF_API_HOOK=1, as
# gpuprofd's agent.late_attach_hook asks: API records by callback id), pinned (CUPTI's profiling
# buffers in pinned host memory), devbuf (32 MB profiling buffers), bigbuf (16 MB activity
# buffers). Mode idleinit: injected, no session, API callback ids forced on at initialisation
# (what honouring a hint costs a process that is then not traced). Mode idlehook: injected, no
# session, the runtime hooked inside cuInit (GPUPROF_API_HOOK=1).
declare -A MODE_ENV=([nozero]=GPUPROF_CUPTI_ZEROED=0 [cbid]="GPUPROF_API_MODE=cbid GPUPROF_API_AT_INIT=0 GPUPROF_API_HOOK=0"
  [late]="GPUPROF_API_AT_INIT=0 GPUPROF_API_HOOK=0" [hooked]="GPUPROF_API_AT_INIT=0 GPUPROF_API_HOOK=1" [pinned]=GPUPROF_CUPTI_PINNED=1
  [devbuf]=GPUPROF_CUPTI_DEVICE_BUFFER_MB=32 [bigbuf]=GPUPROF_BUFFER_KB=16384
  [pinned_devbuf]="GPUPROF_CUPTI_PINNED=1 GPUPROF_CUPTI_DEVICE_BUFFER_MB=32")
for v in "${!MODE_ENV[@]}"; do PRESET[$v]=default; done
if [[ " $SCENARIOS " == *" overhead "* ]]; then
  declare -A L T
  traced_run() { # preset skip env command... ; one session per run; kernels stored and drops to files
    local preset=$1 skip=$2 envs=$3; shift 3
    local s; s=$(session_start --preset "$preset" --name overhead)
    # shellcheck disable=SC2086
    env CUDA_INJECTION64_PATH="$INJ" GPUPROF_TRACE_SKIP="$skip" $envs "$@"
    session_stop "$s"
    "${CTL[@]}" --json top "$s" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["kernel_count"])' >>"$STATE/traced_kernels"
    local sync api
    sync=$("${CTL[@]}" --json query "$s" --kind sync --limit 200000 | wc -l)
    api=$("${CTL[@]}" --json top "$s" | "$PY" -c 'import json,sys; print(sum(a["count"] for a in json.load(sys.stdin)["api_calls"]))')
    echo "$preset/${skip:-none}${envs:+/$envs}: sync records ${sync} (capped at 200000), api records ${api}" >>"$STATE/traced_counts"
    "${CTL[@]}" --json session show "$s" |
      "$PY" -c 'import json,sys; print(sum(p.get("dropped",0) for p in json.load(sys.stdin).get("processes",[])))' >>"$STATE/traced_drops"
  }
  run_mode() { # mode command...
    local mode=$1; shift
    case $mode in
      none) "$@" ;;
      idle) CUDA_INJECTION64_PATH="$INJ" "$@" ;;
      idleinit) CUDA_INJECTION64_PATH="$INJ" GPUPROF_API_AT_INIT=1 "$@" ;;
      idlehook) CUDA_INJECTION64_PATH="$INJ" GPUPROF_API_HOOK=1 "$@" ;;
      inert) CUDA_INJECTION64_PATH="$INJ" GPUPROF_DISABLE=1 "$@" ;;
      floor) CUDA_INJECTION64_PATH="$STATE/libfloor.so" "$@" 2>&1 | tr '\n' ' ' ;;
      floor_kernel | floor_launch)
        FLOOR_PARTS=${mode#floor_} CUDA_INJECTION64_PATH="$STATE/libfloor_min.so" "$@" 2>&1 | tr '\n' ' ' ;;
      *) traced_run "${PRESET[$mode]}" "${SKIP[$mode]:-}" "${MODE_ENV[$mode]:-}" "$@" ;;
    esac
  }
  : >"$STATE/traced_kernels"; : >"$STATE/traced_drops"; : >"$STATE/traced_counts"
  for rep in $(seq "$REPS"); do
    for mode in $LAUNCH_MODES; do
      out=$(run_mode "$mode" "$STATE/bench_launch" 200000 1500)
      echo "launch $mode: $out" | tee -a "$STATE/run_overhead.log"
      L[$mode]="${L[$mode]:-} $(echo "$out" | grep -oE 'per_launch_us=[0-9.]+' | cut -d= -f2)"
    done
  done
  for rep in $(seq "$REPS"); do
    for mode in $TORCH_MODES; do
      if [ "$mode" = kineto ]; then out=$("$PY" "$HERE/bench_torch.py" kineto 50000 1.5)
      else out=$(run_mode "$mode" "$PY" "$HERE/bench_torch.py" none 50000 1.5); fi
      echo "torch $mode: $out" | tee -a "$STATE/run_overhead.log"
      T[$mode]="${T[$mode]:-} $(echo "$out" | grep -oE 'per_op_us=[0-9.]+' | cut -d= -f2)"
    done
  done
  ln=$(echo "${L[none]}" | median)
  tn=$(echo "${T[none]}" | median)
  for mode in $LAUNCH_MODES; do
    v=$(echo "${L[$mode]}" | median)
    figure "launch $mode: median $v us/launch (runs:${L[$mode]}) = $(calc "$v / $ln")x untraced"
  done
  for mode in $TORCH_MODES; do
    v=$(echo "${T[$mode]}" | median)
    figure "torch $mode: median $v us/op (runs:${T[$mode]}) = $(calc "$v / $tn")x untraced"
  done
  sort "$STATE/traced_counts" | uniq -c | sed 's/^/records per traced run: /'
  figure "traced runs (launch then torch, in mode order per rep): kernels stored $(tr '\n' ' ' <"$STATE/traced_kernels"); dropped $(tr '\n' ' ' <"$STATE/traced_drops")"
  [[ " $LAUNCH_MODES " == *" traced "* ]] && [[ " $TORCH_MODES " == *" traced "* ]] || exit 0
  r=$(calc "$(echo "${L[traced]}" | median) / $ln")
  pass_if "launch traced <= 1.3x untraced (api_from_start=$API_FROM_START)" "$(calc "$r <= 1.3")" "${r}x"
  r=$(calc "$(echo "${T[traced]}" | median) / $tn")
  pass_if "torch traced <= 1.25x untraced (api_from_start=$API_FROM_START)" "$(calc "$r <= 1.25")" "${r}x"
  if [[ " $LAUNCH_MODES $TORCH_MODES " == *" lean "* ]]; then
    r=$(calc "$(echo "${L[lean]}" | median) / $ln")
    r2=$(calc "$(echo "${T[lean]}" | median) / $tn")
    pass_if "lean (default without sync, external correlation): launch <= 1.3x, torch <= 1.25x" \
      "$(calc "$r <= 1.3 && $r2 <= 1.25")" "launch ${r}x, torch ${r2}x"
  fi
  if [[ " $LAUNCH_MODES " == *" idle "* ]] && [[ " $TORCH_MODES " == *" idle "* ]]; then
    ri=$(calc "$(echo "${L[idle]}" | median) / $ln")
    ti=$(calc "$(echo "${T[idle]}" | median) / $tn")
    pass_if "idle <= 1.02x untraced" "$(calc "$ri <= 1.02 && $ti <= 1.02")" "launch ${ri}x, torch ${ti}x"
  fi
  drops=$(awk '{s += $1} END {print s + 0}' "$STATE/traced_drops")
  short=$(awk '$1 < 100000 {n++} END {print n + 0}' "$STATE/traced_kernels")
  pass_if "no dropped records while traced, every traced run stored >= 100k kernels" \
    "$([ "$drops" = 0 ] && [ "$short" = 0 ] && echo 1)" "dropped $drops, short runs $short"
fi
grep -iE " (warn|error) " "$STATE/gpuprofd.log" | tail -5 || true
