"""The small-kernel PyTorch loop (two elementwise kernels an iteration, ~8 us) for argv[1] seconds
with no synchronization but the last, after argv[2] s of pause (a session attaches meanwhile).
Prints per_op_us."""
import os, sys, time, torch
secs = float(sys.argv[1]); pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
x = torch.randn(1024, device="cuda")
for _ in range(2000): x = x * 1.0000001 + 0.0
torch.cuda.synchronize()
time.sleep(pause)
chunks = os.environ.get("SMALL_CHUNKS") == "1"
n, t = 0, time.perf_counter()
c, cn = t, 0
while True:
    for _ in range(1000): x = x * 1.0000001 + 0.0
    n += 1000
    now = time.perf_counter()
    if chunks and now - c >= 0.5:
        # Each half second's pace (the injector's log says when its windows opened and closed).
        utc = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        print(f"CHUNK utc={utc} per_op_us={(now - c) / (n - cn) / 2 * 1e6:.3f}", flush=True)
        c, cn = now, n
    if now - t >= secs: break
torch.cuda.synchronize()
s = time.perf_counter() - t
print(f"SMALL pid={os.getpid()} n={n} secs={s:.3f} per_op_us={s / n / 2 * 1e6:.3f}")
