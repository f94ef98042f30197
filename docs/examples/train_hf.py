"""A plain Hugging Face fine-tuning loop, as people write it: `from_pretrained` (with a
`device_map`, bf16, optionally 4-bit through bitsandbytes), optionally gradient checkpointing and
LoRA through PEFT, then a loop of forward with labels, backward, `AdamW(fused=True)` (the HF
Trainer's default optimizer) and `zero_grad`.

    python train_hf.py MODEL_DIR [--batch 1] [--seq 512] [--lora-rank 16 --targets q_proj v_proj]
                                 [--qlora] [--ckpt] [--device-map auto|cuda] [--dtype bf16]

Check it before renting the GPUs:

    vramplan validate --script docs/examples/train_hf.py --hardware t4x2 -- MODEL_DIR --lora-rank 16
"""

import argparse

import torch
from transformers import AutoConfig, AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--seq", type=int, default=512)
parser.add_argument("--lora-rank", type=int, default=0)
parser.add_argument("--targets", nargs="+", default=["q_proj", "v_proj"])
parser.add_argument("--qlora", action="store_true")
parser.add_argument("--ckpt", action="store_true")
parser.add_argument("--device-map", default="cuda")
parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
quantization = None
if args.qlora:
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=dtype)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, device_map=args.device_map,
                                             quantization_config=quantization)
if args.qlora:
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.ckpt,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
elif args.ckpt:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
if args.lora_rank:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                             target_modules=args.targets, task_type="CAUSAL_LM"))
model.train()
vocab = AutoConfig.from_pretrained(args.model).get_text_config().vocab_size
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
for step in range(args.steps):
    ids = torch.randint(0, vocab, (args.batch, args.seq)).to(model.device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step}: loss {loss.item():.4f}")
