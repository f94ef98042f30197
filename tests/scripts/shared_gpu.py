"""A DDP script that never calls `torch.cuda.set_device(LOCAL_RANK)`: every rank on GPU 0."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(1024, 1024).to("cuda"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
