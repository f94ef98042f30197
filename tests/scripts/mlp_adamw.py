"""A plain MLP trained with AdamW in fp32 on `cuda`: the closed-form check of `validate --script`'s
memory (tests/tests/validate_script.rs derives its peak from PyTorch's AdamW)."""

import torch

device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(10):
    x = torch.randn(64, 1024, device=device)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
