"""The optimizer made before the model moves to the GPU (accelerate's documented order, and any
script that builds the optimizer first): on a GPU the parameters stay the same objects, so the
optimizer steps the moved tensors and its states live on the GPU."""

import torch

model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.to("cuda")
for step in range(10):
    loss = model(torch.randn(64, 1024, device="cuda")).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
