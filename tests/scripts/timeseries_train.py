"""A small time-series transformer, PatchTST-style, written as people write one: the model of
docs/examples/timeseries-transformer.yaml (patches of 16 steps embedded to width 128, learned
positions, three pre-norm encoder blocks with 8 heads, a linear head forecasting 96 steps), its
modules named as the YAML names them, trained with AdamW in fp32.

    python timeseries_train.py [--batch 32] [--patches 64]

`vramplan validate --script timeseries_train.py --hardware t4 --trace-out run.json` measures
what each block keeps for backward; `vramplan estimate docs/examples/timeseries-transformer.yaml
--activations run.json ...` then estimates with those bytes in place of the YAML's declaration.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(width, 3 * width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.in_proj(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(1, 2).reshape(b, s, w))


class FeedForward(nn.Module):
    def __init__(self, width, inner):
        super().__init__()
        self.linear1 = nn.Linear(width, inner)
        self.linear2 = nn.Linear(inner, width)

    def forward(self, x):
        return self.linear2(F.gelu(self.linear1(x)))


class TSTEncoderLayer(nn.Module):
    def __init__(self, width=128, heads=8, inner=512):
        super().__init__()
        self.self_attn = Attention(width, heads)
        self.norm1 = nn.LayerNorm(width)
        self.ff = FeedForward(width, inner)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(TSTEncoderLayer() for _ in range(3))


class TimeSeriesTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embedding = nn.Linear(16, 128)
        self.position_embedding = nn.Embedding(512, 128)
        self.encoder = Encoder()
        self.head = nn.Linear(128, 96)

    def forward(self, patches):
        positions = torch.arange(patches.shape[1], device=patches.device)
        h = self.patch_embedding(patches) + self.position_embedding(positions)
        for layer in self.encoder.layers:
            h = layer(h)
        return self.head(h[:, -1])


parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--patches", type=int, default=64)
args = parser.parse_args()
device = torch.device("cuda")
model = TimeSeriesTransformer().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(10):
    patches = torch.randn(args.batch, args.patches, 16, device=device)
    target = torch.randn(args.batch, 96, device=device)
    loss = F.mse_loss(model(patches), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
