# NVTX ranges and marks from PyTorch: exactly RANGES pushed/popped ranges named "gpuprof_step"
# (each around one small kernel) and MARKS marks named "gpuprof_mark".
# usage: nvtx.py [ranges] [marks] [sleep_s_after_init]
import sys, time, torch
ranges = int(sys.argv[1]) if len(sys.argv) > 1 else 50
marks = int(sys.argv[2]) if len(sys.argv) > 2 else 7
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
time.sleep(pause)  # the trace starts asynchronously after the injector's hello
x = torch.ones(1 << 16, device="cuda")
for _ in range(ranges):
    torch.cuda.nvtx.range_push("gpuprof_step")
    x = x * 1.0001
    torch.cuda.nvtx.range_pop()
for _ in range(marks):
    torch.cuda.nvtx.mark("gpuprof_mark")
torch.cuda.synchronize()
print(f"NVTX ranges={ranges} marks={marks}")
