"""A transformers Llama (8 layers, hidden 1024, bf16, AdamW, batch 8x512) training for argv[1]
seconds with `loss.backward(); opt.step()` and no synchronization in the loop (no `.item()`,
no `torch.cuda.synchronize()`): the loop PC sampling must see without one. Prints its pid first,
steps and ms per step at the end (after the one synchronization, past the loop)."""
import os, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
print(f"LLAMA pid={os.getpid()}", flush=True)
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
model = LlamaForCausalLM(cfg).to("cuda", dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
print(f"LLAMA pid={os.getpid()} ready", flush=True)
steps, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    steps += 1
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"LLAMA pid={os.getpid()} steps={steps} ms_per_step={dt * 1e3 / steps:.2f}", flush=True)
