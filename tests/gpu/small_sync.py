"""The 100k-small-kernel PyTorch loop (bench_torch.py's) with a synchronization every 100
operations, as a training loop's `.item()` makes one: windows can open and close within it.
usage: small_sync.py N [PAUSE_S]; prints per_op_us.
"""
import sys, time, torch
n = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
x = torch.randn(1024, device="cuda")
for _ in range(2000): x = x * 1.0000001 + 0.0
torch.cuda.synchronize()
time.sleep(pause)
t = time.perf_counter()
for i in range(n):
    x = x * 1.0000001 + 0.0
    if i % 100 == 99:
        torch.cuda.synchronize()
torch.cuda.synchronize()
s = time.perf_counter() - t
print(f"SMALLSYNC n={n} secs={s:.4f} per_op_us={s/n/2*1e6:.3f}")
