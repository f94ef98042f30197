"""Incident: a hard-coded "cuda:0" index in a DDP training step (heterogeneous GNN).

Modelled on DDP reports such as Stability-AI/stablediffusion#106 ("DDP mode problem":
"Expected all tensors to be on the same device ... cuda:0 and cuda:1") and
pytorch/pytorch#90723, where ranks other than 0 got tensors on GPU 0. The code was
written for one GPU and still names device 0.

A user/item heterogeneous GNN (index_select + index_add_ message passing, one
Linear per relation) is trained under DDP. Each rank puts the model and the graph
on `cuda:LOCAL_RANK`. The item nodes for the loss of each step are sampled with
`torch.randint(..., device="cuda:0")`. On rank 0 that is the rank's own GPU, so it
works. On ranks 1..3, `index_select(item_out on cuda:R, index on cuda:0)` raises a
device mismatch. See ddp_gnn_fixed.py.

Run: torchrun --nproc_per_node=4 ddp_gnn.py   (or plain `python ddp_gnn.py`: world size 1)
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

N_USER, N_ITEM, N_EDGE, D_USER, D_ITEM, HIDDEN, BATCH = 2000, 3000, 20000, 32, 48, 64, 512


def propagate(lin, x_src, edge_index, num_dst):
    """Mean aggregation of lin(x_src) along src -> dst edges (scatter-add)."""
    src, dst = edge_index[0], edge_index[1]
    msg = lin(x_src).index_select(0, src)
    out = torch.zeros(num_dst, msg.shape[1], device=msg.device, dtype=msg.dtype).index_add_(0, dst, msg)
    deg = torch.zeros(num_dst, device=msg.device, dtype=msg.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=msg.dtype))
    return out / deg.clamp(min=1).unsqueeze(-1)


class HeteroGNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_user, self.in_item = nn.Linear(D_USER, HIDDEN), nn.Linear(D_ITEM, HIDDEN)
        self.rates1, self.rated_by1 = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)  # user->item, item->user
        self.rates2, self.self_item2 = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x_user, x_item, edge_index):  # edge_index: row 0 = user, row 1 = item
        u, i = F.relu(self.in_user(x_user)), F.relu(self.in_item(x_item))
        u, i = (F.relu(u + propagate(self.rated_by1, i, edge_index.flip(0), N_USER)),
                F.relu(i + propagate(self.rates1, u, edge_index, N_ITEM)))
        i = F.relu(self.self_item2(i) + propagate(self.rates2, u, edge_index, N_ITEM))
        return self.head(i).squeeze(-1)  # one score per item


def main():
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.manual_seed(rank)

    x_user, x_item = torch.randn(N_USER, D_USER, device=device), torch.randn(N_ITEM, D_ITEM, device=device)
    edge_index = torch.stack([torch.randint(0, N_USER, (N_EDGE,), device=device),
                              torch.randint(0, N_ITEM, (N_EDGE,), device=device)])
    target = torch.randn(N_ITEM, device=device)

    model = HeteroGNN().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for step in range(5):
        # items that get a loss this step; device left over from the single-GPU script
        idx = torch.randint(0, N_ITEM, (BATCH,), device="cuda:0" if use_cuda else "cpu")
        scores = ddp(x_user, x_item, edge_index)
        pred = scores.index_select(0, idx)  # BUG: scores on cuda:LOCAL_RANK, idx on cuda:0
        loss = F.mse_loss(pred, target.index_select(0, idx))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
