"""Incident: the GPU sat at 0 % because the time-series transformer trained on the CPU.

Modelled on natashaklingenbrunn/Transformer-Time-Series-Forecasting#9 ("CUDA
enabled?": "I set device to cuda ... but it runs on cpu"). The advice there was to
move the model and the data to the GPU.

This script computes `device` and even prints "training on cuda". But it never
calls `model.to(device)`, and the DataLoader batches (CPU tensors) are never moved.
No error is raised: the whole run happens on the CPU, and the GPU stays idle.
The bug is the line that makes the model without `.to(device)`. See
timeseries_cpu_fixed.py.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
N_SERIES, N_FEATURES, WINDOW, HORIZON, D_MODEL, BATCH = 256, 8, 96, 24, 128, 32


class TimeSeriesTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_proj = nn.Linear(N_FEATURES, D_MODEL)
        self.pos = nn.Parameter(torch.randn(1, WINDOW, D_MODEL) / math.sqrt(D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=4 * D_MODEL,
                                           dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=3)
        self.head = nn.Linear(D_MODEL, HORIZON * N_FEATURES)  # forecasting head

    def forward(self, x):  # x: (batch, WINDOW, N_FEATURES)
        h = self.encoder(self.input_proj(x) + self.pos)
        return self.head(h[:, -1]).view(-1, HORIZON, N_FEATURES)


def make_loader():
    series = torch.randn(N_SERIES, WINDOW + HORIZON, N_FEATURES).cumsum(dim=1)  # random walks
    windows, futures = series[:, :WINDOW], series[:, WINDOW:]
    return DataLoader(TensorDataset(windows, futures), batch_size=BATCH, shuffle=True)


def main():
    torch.manual_seed(0)
    print(f"training on {device}")
    model = TimeSeriesTransformer()  # BUG: never moved to device; the model stays on the CPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(make_loader()):
        if step == 5:
            break
        pred = model(x)  # x and y are the loader's CPU tensors, never moved to device
        loss = F.mse_loss(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
