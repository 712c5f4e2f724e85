# A PyTorch process driven line by line on stdin, for tests/gpu/detach.sh.
# usage: detach_worker.py small|conv
#   small: the 100k-small-kernel loop of bench_torch.py (x = x * c + 0: two kernels per op)
#   conv:  a conv-net training step (two conv layers, a linear head, SGD) on a fixed batch
# Commands (one per line), each answered with one line:
#   run N      N ops (small) or N steps (conv), synchronized; "done us=<per op or step> cpu=<us>"
#              (cpu: CPU time of this, the launching, thread per op or step, before the final
#              synchronize: what intercepting CUDA calls costs, without the machine's scheduling)
#   kernels N  N small ops whatever the workload (exactly 2N kernels); "done us=..."
#   stats      "stats rss_kb=R threads=T fds=F" from /proc/self
#   profile N  N small ops under torch.profiler; "profile kernels=K launches=R" (CUDA kernel
#              events, cudaLaunchKernel runtime events)
#   quit
import os, sys, time, torch

work = sys.argv[1]
x = torch.randn(1024, device="cuda")


def small(n):
    global x
    for _ in range(n):
        x = x * 1.0000001 + 0.0


if work == "conv":
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = torch.randn(32, 3, 32, 32, device="cuda")
    target = torch.randint(0, 10, (32,), device="cuda")

    def step(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(data), target)
            loss.backward()
            opt.step()
else:
    step = small

step(200 if work == "conv" else 2000)  # warm-up: kernels loaded, allocator primed
torch.cuda.synchronize()
print("ready", flush=True)


def timed(f, n):
    t, c = time.perf_counter(), time.thread_time()
    f(n)
    c = time.thread_time() - c
    torch.cuda.synchronize()
    return f"us={(time.perf_counter() - t) / n * 1e6:.3f} cpu={c / n * 1e6:.3f}"


for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "run":
        print(f"done {timed(step, int(arg[0]))}", flush=True)
    elif cmd == "kernels":
        print(f"done {timed(small, int(arg[0]))}", flush=True)
    elif cmd == "stats":
        rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        threads = len(os.listdir("/proc/self/task"))
        fds = len(os.listdir("/proc/self/fd"))
        print(f"stats rss_kb={rss} threads={threads} fds={fds}", flush=True)
    elif cmd == "profile":
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            small(int(arg[0]))
            torch.cuda.synchronize()
        k = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        r = sum(1 for e in prof.events() if e.name.startswith("cudaLaunchKernel"))
        print(f"profile kernels={k} launches={r}", flush=True)
    elif cmd == "quit":
        break
