"""A process with a CUDA context that launches nothing for argv[1] seconds: PC sampling must give it no samples."""
import os, sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print(f"IDLE pid={os.getpid()}", flush=True)
time.sleep(float(sys.argv[1]))
