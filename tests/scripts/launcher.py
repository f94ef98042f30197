"""Started as `python launcher.py plain` or as torchrun starts it (`launcher.py torchrun`): the
torchrun variables are there exactly when the run says it is torchrun's; and a loss over the
positions a boolean mask selects (the shape depends on values, which a fake run takes as all)."""

import os
import sys

import torch

torchrun = sys.argv[1] == "torchrun"
assert ("RANK" in os.environ) == torchrun and ("WORLD_SIZE" in os.environ) == torchrun, dict(os.environ)
model = torch.nn.Linear(64, 64).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    h = model(torch.randn(8, 16, 64, device="cuda"))
    labels = torch.randint(-100, 10, (8, 16), device="cuda")
    loss = h[labels != -100].pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
