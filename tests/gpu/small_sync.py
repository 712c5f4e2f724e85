"""The 100k-small-kernel PyTorch loop (bench_torch.py's) with a synchronization every 100
operations, as a training loop's `.item()` makes one: windows can open and close within it.
usage: small_sync.py N [PAUSE_S] [CHUNK] [WARM_N]; prints per_op_us (and with CHUNK, each CHUNK
ops' per_op_us and when that chunk ended, to see how the cost moves over the run). WARM_N ops of
the same loop run first, untimed (a process's one-time costs, such as CUPTI's set-up at the first
PC-sampling window, fall there: what is timed is the steady state).
"""
import sys, time, torch
n = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 0
warm = int(sys.argv[4]) if len(sys.argv) > 4 else 0
x = torch.randn(1024, device="cuda")
for _ in range(2000): x = x * 1.0000001 + 0.0
for i in range(warm):
    x = x * 1.0000001 + 0.0
    if i % 100 == 99:
        torch.cuda.synchronize()
torch.cuda.synchronize()
time.sleep(pause)
t = c = time.perf_counter()
for i in range(n):
    x = x * 1.0000001 + 0.0
    if i % 100 == 99:
        torch.cuda.synchronize()
    if chunk and i % chunk == chunk - 1:
        now = time.perf_counter()
        utc = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        print(f"CHUNK utc={utc} at_s={now - t:.3f} per_op_us={(now - c) / chunk / 2 * 1e6:.3f}", flush=True)
        c = now
torch.cuda.synchronize()
s = time.perf_counter() - t
print(f"SMALLSYNC n={n} secs={s:.4f} per_op_us={s/n/2*1e6:.3f}")
