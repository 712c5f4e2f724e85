# An injected process that uses torch.profiler while gpuprof traces it: torch.profiler must
# still record its CUDA events, and gpuprof must report the process as displaced.
import sys, time, torch
from torch.profiler import profile, ProfilerActivity
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
time.sleep(2.0)                      # gpuprof's trace starts
x = torch.randn(4096, 4096, device="cuda")
for _ in range(200): x = x * 1.0001 + 0.0   # traced by gpuprof
torch.cuda.synchronize()
time.sleep(0.6)                      # gpuprof flushes these
t0 = time.time()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    while time.time() - t0 < 3.0:    # long enough for gpuprof to notice
        for _ in range(50): x = x * 1.0001 + 0.0
        torch.cuda.synchronize()
ev = sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
print(f"COEXIST torch_profiler_cuda_events={ev}")
time.sleep(1.5)                      # state report reaches the daemon
sys.exit(0 if ev > 0 else 1)
