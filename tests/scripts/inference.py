"""An inference loop with no optimizer: `validate --script` stops after `--steps` forward passes of
the model."""

import torch

model = torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.Linear(256, 1000)).cuda().eval()
ids = torch.randint(0, 1000, (1, 16), device="cuda")
with torch.no_grad():
    for _ in range(1000):
        logits = model(ids)
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
