# Two phases of the small-kernel loop of bench_torch.py in one process: phase 1, then a pause
# until a file appears (the caller stops gpuprof's session meanwhile), then phase 2 repeated.
# usage: phases.py READY_FILE GO_FILE N REPS ; prints per-op times (us) of both phases.
import os, statistics, sys, time, torch
ready, go, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = torch.randn(1024, device="cuda")
for _ in range(2000): x = x * 1.0000001 + 0.0
torch.cuda.synchronize()
time.sleep(1.5)  # the trace starts
def loop():
    global x
    t = time.perf_counter()
    for _ in range(n): x = x * 1.0000001 + 0.0
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n / 2 * 1e6
p1 = statistics.median(loop() for _ in range(reps))
open(ready, "w").close()
while not os.path.exists(go): time.sleep(0.01)
time.sleep(0.5)
p2 = statistics.median(loop() for _ in range(reps))
print(f"PHASES phase1_us={p1:.3f} phase2_us={p2:.3f}")
