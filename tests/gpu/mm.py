# bf16 NxN matmuls (N = argv[3], default 8192) for argv[1] s after argv[2] s of warm-up (a
# synchronization after each), a synchronization after every argv[4] (default 10) in the timed part;
# prints when the timed part began (UTC, as the injector's log lines) and ms per matmul.
import os, sys, time, torch
secs, warm = float(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 10
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
t0 = time.time()
while time.time() - t0 < warm: c = a @ b; torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"MM pid={os.getpid()} timed_from={time.strftime('%H:%M:%S', time.gmtime())}.{int(time.time() * 1000) % 1000:03d}", flush=True)
k, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    for _ in range(batch): c = a @ b
    torch.cuda.synchronize(); k += batch
print(f"MM pid={os.getpid()} ms_per_iter={(time.perf_counter() - t0) * 1e3 / k:.4f} iters={k}", flush=True)
