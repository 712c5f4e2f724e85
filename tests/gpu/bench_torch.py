# gpu-anchors/torch_small.py with a pause before the timed loop (argv[3], s), so a trace
# started asynchronously after the injector's hello covers the whole timed loop in every mode.
import sys, time, torch
mode, n = sys.argv[1], int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
x = torch.randn(1024, device="cuda")
for _ in range(2000): x = x * 1.0000001 + 0.0
torch.cuda.synchronize()
time.sleep(pause)
def loop():
    global x
    t = time.perf_counter()
    for _ in range(n): x = x * 1.0000001 + 0.0
    torch.cuda.synchronize()
    return time.perf_counter() - t
if mode == "kineto":
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        s = loop()
    ev = sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"TORCH mode={mode} n={n} secs={s:.4f} per_op_us={s/n/2*1e6:.3f} cuda_events={ev}")
else:
    s = loop()
    print(f"TORCH mode={mode} n={n} secs={s:.4f} per_op_us={s/n/2*1e6:.3f}")
