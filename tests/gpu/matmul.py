# Exactly 100 bf16 matmuls of 8192x8192 and three copies of known sizes; prints what it did.
# usage: matmul.py [exit_code] [sleep_s_after_init]
import sys, time, torch
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
torch.cuda.init()
torch.zeros(1, device="cuda")  # context and allocator up
torch.cuda.synchronize()
time.sleep(pause)  # the trace starts asynchronously after the injector's hello
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
h2d_pageable = torch.ones(1 << 20, dtype=torch.float32)            # 4194304 bytes
h2d_pinned = torch.ones(1 << 24, dtype=torch.float32).pin_memory()  # 67108864 bytes
x = h2d_pageable.to("cuda")
y = h2d_pinned.to("cuda", non_blocking=True)
c = None
for _ in range(100):
    c = a @ b
torch.cuda.synchronize()
out = c.float().cpu()                                               # 268435456 bytes D2H
print(f"MATMUL done=100 n={n} h2d={x.numel()*4},{y.numel()*4} d2h={out.numel()*4} sum_finite={bool(torch.isfinite(out).all())}")
sys.exit(code)
