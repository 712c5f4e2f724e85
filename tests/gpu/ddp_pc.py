"""A small DDP training loop for torchrun (one rank per GPU, NCCL all-reduce), for PC sampling
and job checks: a few bf16 linear layers, STEPS steps, prints the rank's step time and the
NCCL collectives it issued after DDP's set-up (its gradient all-reduces, through a comm hook
that counts them, and the loop's broadcasts).
usage: torchrun --nproc_per_node=N ddp_pc.py [SECONDS] [SLOW_RANK]
"""
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
slow = int(sys.argv[2]) if len(sys.argv) > 2 else -1
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
print(f"RANKPID rank={rank} pid={os.getpid()}", flush=True)
dist.init_process_group("nccl")
torch.manual_seed(rank)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, dtype=torch.bfloat16) for _ in range(4)]).cuda()
ddp = DDP(model, device_ids=[local])
issued = {"AllReduce": 0, "Broadcast": 0}


def counted_allreduce(_state, bucket):
    issued["AllReduce"] += 1
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()))


ddp.register_comm_hook(None, counted_allreduce)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
extra = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
steps, t0 = 0, time.perf_counter()
while True:
    loss = ddp(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if rank == slow:
        extra @ extra
    steps += 1
    if steps == 1:
        print(f"TRAINING rank={rank}", flush=True)
    # Every rank runs the same number of steps: rank 0 decides when to stop.
    done = torch.tensor([1 if time.perf_counter() - t0 > secs else 0], device="cuda")
    dist.broadcast(done, 0)
    issued["Broadcast"] += 1
    if done.item():
        break
dt = (time.perf_counter() - t0) / steps
print(f"DDP rank={rank} local_rank={local} steps={steps} step_ms={dt * 1e3:.3f} loss={loss.item():.4f}", flush=True)
print(f"COLLS rank={rank} " + " ".join(f"{k}={v}" for k, v in issued.items()), flush=True)
dist.destroy_process_group()
