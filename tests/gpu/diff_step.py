"""One PyTorch training step of a small bf16 MLP, STEPS times (argv[2], default 200), then one
synchronization: the two runs of tests/gpu/diff.sh differ only in the width of the second hidden
layer (argv[1]; the first run 4096, the second 8192)."""
import sys, torch
wide = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.GELU(),
    torch.nn.Linear(4096, wide), torch.nn.GELU(),
    torch.nn.Linear(wide, 4096), torch.nn.GELU(),
    torch.nn.Linear(4096, 1024),
).to("cuda", torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(steps):
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(f"STEP wide={wide} steps={steps} loss={loss.item():.4f}")
