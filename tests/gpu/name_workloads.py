"""Workloads whose kernels carry the names operators meet (cuDNN, cuBLAS, CUTLASS, PyTorch's own
templates, Triton), for the kernel-name check (kernel_names.sh).
usage: name_workloads.py WORKLOAD [TORCH_PROFILER_OUT]
  WORKLOAD: conv (a conv-net training step), llama (a transformers Llama training step built from
  a config), compile (a torch.compile'd function: Triton kernels).
  With TORCH_PROFILER_OUT the steps run under torch.profiler and the GPU kernels it saw are
  written there, one "count<TAB>name" line per name.
"""
import collections, sys
import torch

work, out = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
torch.manual_seed(0)


def conv():
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 7, stride=2, padding=3), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.BatchNorm2d(128),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10),
    ).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 224, 224, device="cuda"), torch.randint(0, 10, (32,), device="cuda")

    def step():
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    m = LlamaForCausalLM(cfg).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, 8000, (4, 256), device="cuda")

    def step():
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def compiled():
    @torch.compile
    def f(a, b):
        return torch.nn.functional.gelu(a @ b + 1.0).softmax(-1).sum(0)
    a, b = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    return lambda: f(a, b)


step = {"conv": conv, "llama": llama, "compile": compiled}[work]()
for _ in range(3):  # warm-up: autotuning and compilation happen here, outside the profile
    step()
torch.cuda.synchronize()
if out:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    names = collections.Counter(
        e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
        and not e.name.startswith(("Memcpy", "Memset")))
    with open(out, "w") as f:
        for n, c in sorted(names.items()):
            f.write(f"{c}\t{n}\n")
else:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
print(f"NAMES {work} done", flush=True)
