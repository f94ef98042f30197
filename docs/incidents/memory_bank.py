"""Incident: a memory tensor made inside forward() without device= (XLNet-style memory).

Modelled on huggingface/transformers#769 ("XLNet tensor at wrong device"): XLNet's
forward built a helper tensor with a bare factory call (torch.arange(klen)), so it was
on the CPU while the model was on the GPU. The fix was `.to(x.device)`.

This tiny XLNet-like model has a "gated memory mixture" after each block. Its
memory state is made with `torch.zeros(batch, mem_len, d)`. No device= is given,
so the tensor is on the CPU. On the CPU everything works. After `model.to("cuda")`,
the line that writes the CUDA hidden states into the CPU memory raises
"Expected all tensors to be on the same device ... cuda:0 and cpu".
See memory_bank_fixed.py for the one-line fix.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB, D, HEADS, LAYERS, MEM_LEN = 1000, 128, 4, 2, 16
BATCH, SEQ = 8, 64


class GatedMemoryMixture(nn.Module):
    def __init__(self, d, mem_len):
        super().__init__()
        self.mem_len = mem_len
        self.gate = nn.Linear(d, d)
        self.write = nn.Linear(d, d)

    def forward(self, h):
        batch, seq, d = h.shape
        mem = torch.zeros(batch, self.mem_len, d)  # memory state: no device=, so it is on the CPU
        slots = torch.arange(seq, device=h.device) % self.mem_len  # the memory slot each position reads
        g = torch.sigmoid(self.gate(h))
        mem = mem + self.write(h[:, -self.mem_len:, :])  # BUG: CPU memory + CUDA hidden state
        read = torch.index_select(mem, 1, slots)
        return g * h + (1.0 - g) * read


class Block(nn.Module):
    def __init__(self, d, heads, mem_len):
        super().__init__()
        self.attn = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.memory = GatedMemoryMixture(d, mem_len)

    def forward(self, h, attn_mask):
        return self.memory(self.attn(h, src_mask=attn_mask))


class TinyXLNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block(D, HEADS, MEM_LEN) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        h = self.embed(input_ids) + self.pos(positions)
        attn_mask = nn.Transformer.generate_square_subsequent_mask(seq, device=input_ids.device)
        for block in self.blocks:
            h = block(h, attn_mask)
        return self.head(self.norm(h))


def main():
    torch.manual_seed(0)
    model = TinyXLNet().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(5):
        input_ids = torch.randint(0, VOCAB, (BATCH, SEQ)).to(device)
        targets = torch.randint(0, VOCAB, (BATCH, SEQ)).to(device)
        logits = model(input_ids)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
