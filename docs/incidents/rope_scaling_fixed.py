"""Fixed version of rope_scaling.py (learned RoPE-scaling parameter left on the CPU).

Modelled on the RoPE device-mismatch reports huggingface/transformers#35608 and
unslothai/unsloth#840. In both, a position tensor kept by the RoPE code stayed on the
CPU while the model ran on the GPU.

The `PositionScaling` module is made after `from_pretrained(..., device_map="auto")`
has placed the model, so no one moves its parameter. The fix moves the module to the
device of the layer it feeds (layer 0, read from its q_proj weight). Then
`positions * self.position_scaling` runs with both operands on that GPU.

Usage: python rope_scaling_fixed.py [model_folder]   (default: tiny-llama beside this file)
"""
import os
import sys

import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_PATH = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "tiny-llama")


class PositionScaling(nn.Module):
    """Adds sin(position * learned per-dimension scale) to each head's slice of the hidden states."""

    def __init__(self, head_dim):
        super().__init__()
        self.position_scaling = nn.Parameter(torch.ones(head_dim))  # made on the CPU, moved below

    def signal(self, position_ids, hidden):
        positions = position_ids.unsqueeze(-1).float()  # (batch, seq, 1), on the GPU of layer 0
        angles = positions * self.position_scaling  # both on layer 0's device
        return torch.sin(angles).to(hidden.dtype)  # (batch, seq, head_dim)

    def pre_hook(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        batch, seq, width = hidden.shape
        heads = width // self.position_scaling.shape[0]
        sig = self.signal(kwargs["position_ids"].expand(batch, seq), hidden)
        hidden = (hidden.view(batch, seq, heads, -1) + sig.unsqueeze(2)).view(batch, seq, width)
        if args:
            return (hidden,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}


def main():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL_PATH, device_map="auto", dtype=torch.bfloat16)
    model.train()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    scaling = PositionScaling(head_dim).to(model.model.layers[0].self_attn.q_proj.weight.device)  # FIX: follow layer 0
    model.model.layers[0].register_forward_pre_hook(scaling.pre_hook, with_kwargs=True)

    params = [p for p in model.parameters() if p.requires_grad] + list(scaling.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    input_device = "cuda:0" if torch.cuda.is_available() else model.device
    for step in range(3):
        input_ids = torch.randint(0, cfg.vocab_size, (2, 64)).to(input_device)
        loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
