# An injected process that uses torch.profiler while gpuprof traces it: torch.profiler must
# still record its CUDA events, and gpuprof must report the process as displaced.
# usage: coexist.py [late|early]
#   late:  gpuprof's trace is running when torch.profiler starts (gpuprof notices and stands down)
#   early: torch.profiler runs once before gpuprof's trace starts (gpuprof refuses at start), then again
import sys, time, torch
from torch.profiler import profile, ProfilerActivity
mode = sys.argv[1] if len(sys.argv) > 1 else "late"
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
x = torch.randn(4096, 4096, device="cuda")

def profiled(seconds):
    global x
    launched = 0
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        t0 = time.time()  # after the profiler's (slow, first-time) start
        while time.time() - t0 < seconds:
            for _ in range(50): x = x * 1.0001 + 0.0
            launched += 100
            torch.cuda.synchronize()
    ev = sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return ev, launched

if mode == "early":
    ev0, n0 = profiled(0.5)
    print(f"COEXIST before_trace torch_profiler_cuda_events={ev0} launched={n0}")
time.sleep(2.0)                      # gpuprof's trace starts
for _ in range(200): x = x * 1.0001 + 0.0   # traced by gpuprof (late mode)
torch.cuda.synchronize()
time.sleep(0.6)                      # gpuprof flushes these
ev, n = profiled(3.0)                # long enough for gpuprof to notice
print(f"COEXIST mode={mode} torch_profiler_cuda_events={ev} launched={n}")
time.sleep(1.5)                      # the state report reaches the daemon
sys.exit(0 if ev > 0 else 1)
