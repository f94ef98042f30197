"""The reference tracer of FSDP with QLoRA (issue 33): runs Answer.AI's fsdp_qlora training step
(github.com/AnswerDotAI/fsdp_qlora, train.py at 05ed9f2) with the real torch FSDP1
(`FullyShardedDataParallel`) on a fake process group (`FakeStore` + `init_process_group("fake")`,
world size 2 by default) under FakeTensorMode, and records rank 0's peak with PyTorch's MemTracker,
as trace.py does for the single-GPU step (its PeakTracker, 4-bit linears and PEFT wrapper are
reused).

What runs, as train.py sets it up with its defaults (`--train_type qlora --precision bf16`):
- the model built from vramplan's built-in config in bf16; every nn.Linear of `model.model`
  (not the head) a bitsandbytes Linear4bit (nf4, blocks of 64, double quantization) whose packed
  bytes are stored as bf16 (`quant_storage=torch_dtype`, so that FSDP can flatten and shard
  them: FSDP refuses integer tensors, `_validate_tensors_to_flatten`);
- PEFT `get_peft_model(LoraConfig(r, lora_alpha, target_modules))` with train.py's "all" targets
  (q, k, v, up, down, gate projections);
- `FSDP(model, auto_wrap_policy=_or_policy([lambda_policy (every trainable leaf: each LoRA A
  and B), transformer_auto_wrap_policy((LlamaDecoderLayer, MistralDecoderLayer))]),
  use_orig_params=False,
  cpu_offload=CPUOffload(offload_params=...), limit_all_gathers=True,
  sharding_strategy=FULL_SHARD)`, no `mixed_precision` (train.py's bf16 precision), the default
  `backward_prefetch=BACKWARD_PRE`;
- `apply_activation_checkpointing` of every decoder layer (NO_REENTRANT, train.py's default
  `reentrant_checkpointing=False`) when checkpointing is on;
- `torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1)` with
  `foreach=True`, what torch picks for CUDA parameters (the CPU would pick the per-tensor loop);
- two steps (forward with labels, backward, optimizer step, `zero_grad`).

Where the CPU run differs from a GPU's, the tracer makes it keep what the GPU keeps:
- bitsandbytes cannot wrap a fake tensor in `Params4bit`, so the 4-bit linears are trace.py's
  `_linear4bit_like` (the same packed bytes and quantization state) with the packed weight in
  bf16 storage, and bitsandbytes' `fix_4bit_weight_quant_state_from_module` (which re-wraps
  FSDP's plain view of the weight in a `Params4bit`, a new object over the same storage) hands
  the quantization state to the view instead;
- CPU offload: the compute device here is the CPU too, so FSDP's host tensors (each unit's
  pinned `_local_shard` and `_cpu_grad`, and what the optimizer step allocates: it runs on the
  host parameters) are counted on a separate "host" device, and the host-to-device copy of the
  shard that `FlatParamHandle.pre_unshard` makes before the all-gather (`flat_param_to(device)`,
  a no-op between two CPU tensors) is made as a copy; `pin_memory` (not implemented for fake
  tensors) is a copy.
- the quantization state (absmax, nested absmax, codebooks) is no parameter: FSDP neither
  flattens nor shards it, every rank holds all of it; it is tracked as external tensors.

Recorded per configuration: rank 0's device peak, by kind, where it was reached, and the host
bytes at the end.

Usage (from the repository root):
    scripts/reference/run trace-fsdp     # -> fixtures/reference/trace/fsdp-v5.json
    scripts/reference/.venv5/bin/python scripts/reference/trace_fsdp.py --print
"""

import argparse
import functools
import json
import sys

import common
import trace as single  # trace.py: PeakTracker, the 4-bit linears, PEFT, the CUDA-like kernels
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import _WeakRefInfo
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._flat_param import FlatParamHandle
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.weak import WeakIdKeyDictionary

# train.py's `lora_target_modules="all"`.
ALL_TARGETS = ["k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj"]
_LINEAR4BIT_LIKE = single._linear4bit_like
HOST = torch.device("meta")  # the label host bytes are counted under (never the compute device)

# (model, batch, seq, checkpointing, offload_params, lora rank)
CONFIGS = [
    ("tinyllama-1.1b", 1, 512, True, False, 64),
    ("tinyllama-1.1b", 4, 1024, True, False, 64),
    ("tinyllama-1.1b", 1, 512, True, True, 64),
    ("tinyllama-1.1b", 4, 1024, True, True, 64),
    ("llama-3.2-1b", 2, 1024, True, False, 16),
    ("llama-3.2-1b", 2, 1024, True, True, 16),
    ("tinyllama-1.1b", 2, 512, False, False, 64),
]

# Held out: traced after the memory model was set beside the rows above, and not used to shape
# it. Another model and size, four ranks, longer sequences. (model, batch, seq, checkpointing,
# offload_params, lora rank, world size)
HELD_OUT = [
    ("llama-3.2-3b", 1, 2048, True, False, 64, 4),
    ("llama-3.2-3b", 1, 2048, True, True, 64, 4),
    ("mistral-7b", 2, 512, True, False, 32, 2),
    ("mistral-7b", 4, 1024, True, True, 8, 2),
]


def _config(model, batch, seq, ckpt, offload, rank, world=2):
    return {"model": model, "runtime": "fsdp_qlora", "world_size": world, "batch": batch, "seq": seq,
            "ckpt": ckpt, "offload_params": offload, "lora_rank": rank, "lora_alpha": 16,
            "lora_targets": ALL_TARGETS, "dtype": "bf16"}


def _linear4bit_bf16_storage(linear, compute_dtype):
    """trace.py's Linear4bit stand-in with `quant_storage=torch.bfloat16`: bitsandbytes'
    `quantize_4bit` packs n weights into `(n + 1) // 2` bytes and, for a 2-byte storage, views
    them as `((n + 3) // 4, 1)` bf16 elements. The module keeps the quantization state too
    (`Linear4bit.quant_state`), which is what the forward reads once FSDP has replaced the
    weight by a view of its flat parameter."""
    q = _LINEAR4BIT_LIKE(linear, compute_dtype)
    w = q._parameters["weight"]
    n = w.quant_state.shape.numel()
    stored = torch.nn.Parameter(torch.empty((n + 3) // 4, 1, dtype=torch.bfloat16), requires_grad=False)
    for key in ("quant_state", "bnb_quantized", "compress_statistics", "quant_type", "blocksize"):
        setattr(stored, key, getattr(w, key))
    stored.quant_storage = torch.bfloat16
    q._parameters["weight"] = stored
    q.quant_state = w.quant_state
    q.quant_storage = torch.bfloat16
    return q


def _patch_bnb():
    import bitsandbytes.nn.modules as modules

    def fix(module):
        # bitsandbytes wraps the view in `Params4bit(module.weight, quant_state=...)`: the same
        # storage under a new Python object, which a fake tensor cannot become.
        if getattr(module.weight, "quant_state", None) is None:
            module.weight.quant_state = module.quant_state

    modules.fix_4bit_weight_quant_state_from_module = fix


class HostAwareTracker(single.PeakTracker):
    """trace.py's PeakTracker, with host-resident storages counted on a device of their own."""

    def __init__(self):
        super().__init__()
        self.host = WeakIdKeyDictionary()
        self.offload = False
        # Set while `pin_memory` copies a tensor to the host: what it allocates is host memory.
        self.pinning = False

    def mark_host(self, tensor):
        self.host[tensor.untyped_storage()] = True

    def is_host(self, st):
        """Whether a storage is host memory: marked so, made by `pin_memory`, or made by the
        optimizer step while parameters are offloaded (it runs on the host parameters)."""
        host = st in self.host or self.pinning or (self.offload and self._in_opt)
        if host:
            self.host[st] = True
        return host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super(single.PeakTracker, self).__torch_dispatch__(func, types, args, kwargs)
        total = sum(s.get("Total", 0) for d, s in self._curr_mem_snap.items() if d != HOST)
        if total > self.peak_total:
            self.peak_total = total
            self.peak_where = self._where(func)
        return res

    def _update_peak_stats(self, peak_state):
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)


def _patch_offload(tracker):
    """The host side of CPU offload on a CPU-only run (see the module's docstring)."""
    original_to = FlatParamHandle.flat_param_to

    def flat_param_to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        data = self.flat_param.data
        if (self._offload_params and device is not None and torch.device(device).type == self.device.type
                and data.untyped_storage() in tracker.host):
            # The host-to-device copy before the all-gather (`pre_unshard`).
            self.flat_param.data = data.clone()
            return
        original_to(self, *args, **kwargs)

    FlatParamHandle.flat_param_to = flat_param_to

    original_pre_unshard = FlatParamHandle.pre_unshard

    def pre_unshard(self):
        if self._offload_params and self.flat_param.data.untyped_storage() in tracker.host:
            # `self.flat_param.device != self.device` on a GPU: the shard is on the host.
            if self._uses_param_mixed_precision and not self._force_full_precision:
                return original_pre_unshard(self)
            self.flat_param_to(self.device, non_blocking=True)
            self._check_on_compute_device(self.flat_param)
            return True
        return original_pre_unshard(self)

    FlatParamHandle.pre_unshard = pre_unshard

    # MemTracker files each new storage under its tensor's device (`_WeakRefInfo.create_winfo`,
    # from `_track` and `_update_and_maybe_create_winfos`): host storages go under HOST.
    create = _WeakRefInfo.create_winfo

    def create_winfo(st, device, reftype, callback=None):
        return create(st, HOST if tracker.is_host(st) else device, reftype, callback)

    _WeakRefInfo.create_winfo = staticmethod(create_winfo)

    def pin_memory(self, *args, **kwargs):
        # FSDP pins each unit's `_local_shard` and `_cpu_grad` in its lazy init, in the first
        # forward (`_init_param_attributes`): a host copy.
        tracker.pinning = True
        try:
            out = self.clone()
        finally:
            tracker.pinning = False
        tracker.mark_host(out)
        return out

    torch.Tensor.pin_memory = pin_memory
    # The CPU "device handle" FSDP uses on a CPU run has no `Stream.synchronize`, which its
    # offload path calls before the optimizer reads the host gradients; nothing is in flight.
    if not hasattr(torch.cpu.Stream, "synchronize"):
        torch.cpu.Stream.synchronize = lambda self: None


def _quant_state_tensors(model):
    out = []
    for m in model.modules():
        qs = getattr(m, "quant_state", None)
        if qs is None:
            continue
        for t in (qs.absmax, qs.code, qs.offset, getattr(qs.state2, "absmax", None),
                  getattr(qs.state2, "code", None)):
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def trace(config):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    # train.py's `transformer_layer_cls` and `check_fn`: Llama's and Mistral's decoder layers.
    layers = (LlamaDecoderLayer, MistralDecoderLayer)

    raw = common.load_raw_config(config["model"])
    hf_config, _ = common.make_config(raw)
    hf_config.use_cache = False
    cls = common.model_class(raw)
    dtype = torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    tracker = HostAwareTracker()
    tracker.offload = config["offload_params"]
    saved = (FlatParamHandle.flat_param_to, FlatParamHandle.pre_unshard, torch.Tensor.pin_memory,
             single._linear4bit_like, _WeakRefInfo.__dict__["create_winfo"])
    _patch_offload(tracker)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = cls(hf_config)
            single._linear4bit_like = _linear4bit_bf16_storage
            single._quantize_linears(model, dtype)
            single._linear4bit_like = _LINEAR4BIT_LIKE
            model.is_loaded_in_4bit = True
            model = single._peft(model, {"lora_rank": config["lora_rank"], "lora_targets": config["lora_targets"]})
            quant_states = _quant_state_tensors(model)

            def trainable_leaf(module):
                return (len(list(module.named_children())) == 0 and getattr(module, "weight", None) is not None
                        and module.weight.requires_grad)

            policy = functools.partial(_or_policy, policies=[
                functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf),
                functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers),
            ])
            wrapped = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=policy,
                           use_orig_params=False, cpu_offload=CPUOffload(offload_params=config["offload_params"]),
                           limit_all_gathers=True, device_id=torch.device("cpu"))
            if config["ckpt"]:
                from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
                apply_activation_checkpointing(
                    wrapped, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                     checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                    check_fn=lambda m: isinstance(m, layers))
            optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-5,
                                          weight_decay=0.1, foreach=True)
            if config["offload_params"]:
                # FSDP moves each offloaded shard to the host at wrap time (`flat_param_to(cpu)`
                # in `_init_param_handle_from_module`), a no-op here: marked as host instead.
                for module in FSDP.fsdp_modules(wrapped):
                    if module._handle is not None:
                        tracker.mark_host(module._handle.flat_param)
            tracker.track_external(wrapped, optimizer, *quant_states)
            vocab = hf_config.vocab_size
            with tracker:
                for step in range(2):
                    ids = torch.randint(0, vocab, (config["batch"], config["seq"]))
                    loss = wrapped(input_ids=ids, labels=ids).loss
                    loss.backward()
                    del loss
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step == 0:
                        tracker.reset_mod_stats()
                end = {str(d): int(s["Total"]) for d, s in tracker._curr_mem_snap.items()}
            peak = {}
            for dev, snap in tracker._peak_mem_snap.items():
                if dev == HOST:
                    continue
                for kind, value in snap.items():
                    label = kind if isinstance(kind, str) else kind.value
                    peak[label] = peak.get(label, 0) + int(value)
    finally:
        torch.set_default_dtype(previous)
        (FlatParamHandle.flat_param_to, FlatParamHandle.pre_unshard, torch.Tensor.pin_memory,
         single._linear4bit_like, _WeakRefInfo.create_winfo) = saved
    return {"peak_bytes": tracker.peak_total, "peak_by_kind_at_device_peak": peak,
            "peak_where": tracker.peak_where,
            "end_device_bytes": sum(v for k, v in end.items() if k != str(HOST)),
            "end_host_bytes": end.get(str(HOST), 0),
            "quant_state_bytes": sum(t.untyped_storage().nbytes() for t in quant_states)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    parser.add_argument("--only", type=int, help="trace only this configuration (index)")
    parser.add_argument("--held-out", action="store_true", help="trace only the held-out configurations")
    args = parser.parse_args()
    _patch_bnb()
    configs = [_config(*c) for c in CONFIGS] + [{**_config(*c), "held_out": True} for c in HELD_OUT]
    records = []
    for i, config in enumerate(configs):
        if args.only is not None and i != args.only:
            continue
        if args.held_out and not config.get("held_out"):
            continue
        if dist.is_initialized() and dist.get_world_size() != config["world_size"]:
            dist.destroy_process_group()
        if not dist.is_initialized():
            dist.init_process_group("fake", rank=0, world_size=config["world_size"], store=FakeStore())
        record = common.traced_record(config, trace, limit=6)
        records.append(record)
    if args.print or args.only is not None:
        return
    out = common.FIXTURES / "trace" / f"fsdp-{common.TAG}.json"
    if args.held_out and out.exists():
        # Re-tracing the held-out set keeps the other records.
        records = [r for r in json.loads(out.read_text())["records"] if not r.get("held_out")] + records
    common.write_json(out, {"versions": common.versions(), "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
