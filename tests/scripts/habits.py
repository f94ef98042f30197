"""What training scripts do beside the step, each of which a fake run must take as a real run
does: a batch-size finder that catches the out-of-memory error, a tensor hook, the optimizer
stepped from post-accumulate hooks, `torch.autograd.grad`, a checkpoint saved (it must write
nothing), a helper process that outlives the script holding its output."""

import subprocess
import sys

import torch

model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
batch = 1 << 22
while True:
    try:
        model(torch.randn(batch, 2048, device="cuda")).sum().backward()
        break
    except torch.OutOfMemoryError:
        batch //= 2
for p in model.parameters():
    p.grad = None
seen = []
model[0].weight.register_hook(lambda g: seen.append(tuple(g.shape)))
optimizers = {p: torch.optim.Adam([p], foreach=False) for p in model.parameters()}
for p in model.parameters():
    p.register_post_accumulate_grad_hook(lambda p: (optimizers[p].step(), optimizers[p].zero_grad()))
x = torch.randn(64, 2048, device="cuda", requires_grad=True)
(gx,) = torch.autograd.grad(model(x).sum(), x)
assert gx.shape == x.shape
torch.save(model.state_dict(), sys.argv[1])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
for _ in range(3):
    model(torch.randn(64, 2048, device="cuda")).sum().backward()
    assert seen, "the tensor hook ran"
