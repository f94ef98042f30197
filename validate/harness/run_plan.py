"""vramplan's `torch` backend harness: runs one plan with the real runtime and prints what it
measured as one JSON document on stdout.

Written to a temporary folder by `vramplan validate --backend torch` and run with the user's
Python (`--python PATH`), which must have torch, transformers and accelerate (and peft for a
LoRA plan). Nothing is downloaded: the model is built from its config with random weights.

Request (argv[1], a JSON file): the model's raw `config.json` (`config`), the plan's
`device_map` (module -> GPU index, "cpu" or "disk"), and the workload: `mode` (train |
inference), `batch`, `seq`, `dtype` (bf16 | fp16 | fp32), `lora` (null or {rank, alpha,
targets}: the paths of the linear modules to adapt, as vramplan resolves the plan's targets),
`grad_checkpointing`, `steps`.

What it does, as a user's script would:
- builds `architectures[0]` from the config on the meta device in `dtype`
  (accelerate's `init_empty_weights`), then gives every parameter random values on the device
  the map puts it on (a GPU, or the CPU for `cpu` and `disk`), and ties the weights;
- `accelerate.dispatch_model(model, device_map)`: the hooks that move inputs between devices
  and stream offloaded weights, exactly as `from_pretrained(device_map=...)` sets them;
- LoRA through PEFT, gradient checkpointing through transformers;
- `steps` training steps (forward with labels, backward, `torch.optim.AdamW(fused)` step,
  `zero_grad`) or one prefill (`use_cache=True`, `logits_to_keep=1`, under `no_grad`);
- per CUDA device: `max_memory_allocated`, `max_memory_reserved`, and the driver's used bytes
  (`mem_get_info`) at the end.

With `fake_gpus` N > 0 the run needs no GPU: the model is built under PyTorch's
`FakeTensorMode` and `cuda:0` … `cuda:N-1` are fake devices. accelerate places the model on them
exactly as on real ones, and every operation checks its operands' devices as on real ones
(`FakeTensorDeviceMismatchError` carries PyTorch's "Expected all tensors to be on the same
device" message), but nothing is allocated, so nothing is measured; the document says instead
where each tensor ended up (`placed`: bytes per device after dispatch).

A training run whose trainable parameters got no gradient in the first backward is reported as
`not_trained` (the module of the first, and how many): what accelerate's offload does to the
weights of a module listed on `cpu` or `disk` (it streams a new copy for each forward, and the
gradient goes to the copy).

An exception ends the run and is reported with its kind (out_of_memory, device_mismatch,
other), its message, the devices it names and the innermost module running then. Exit 0 with
the document, or 3 when torch, transformers or accelerate cannot be imported (the document says
which).
"""

import contextlib
import copy
import json
import re
import sys


def fail_import(error):
    print(json.dumps({"outcome": "missing_library", "message": f"{type(error).__name__}: {error}"}))
    sys.exit(3)


try:
    import torch
    import transformers
    import accelerate
    from accelerate.utils import set_module_tensor_to_device
except Exception as e:  # noqa: BLE001
    fail_import(e)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_of(name, device_map):
    """The map's device for a parameter or buffer `name` (longest matching key)."""
    best, where = -1, "cpu"
    for key, target in device_map.items():
        if key == "" or name == key or name.startswith(key + "."):
            if len(key) > best:
                best, where = len(key), target
    if isinstance(where, int) or (isinstance(where, str) and where.isdigit()):
        return torch.device("cuda", int(where))
    return torch.device("cpu")


def make_config(raw, strip_quant=True, **overrides):
    """A transformers config object from a raw config.json dict (its quantization_config
    stripped unless strip_quant=False), and whether it had one. The reference scripts
    (scripts/reference/common.py) build their models with this too."""
    cfg = copy.deepcopy(raw)
    had_quantization = "quantization_config" in cfg
    if strip_quant:
        cfg.pop("quantization_config", None)
    cfg.update(overrides)
    model_type = cfg.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **cfg), had_quantization


def model_class(raw):
    """The transformers class a raw config names (`architectures[0]`)."""
    return getattr(transformers, raw["architectures"][0])


def fake_devices(capability=(9, 0)):
    """`FakeTensorMode`, with the two things accelerate needs of a fake tensor that a real one
    has: `set_module_tensor_to_device` makes a parameter anew with `type(param)(value,
    requires_grad=...)`, and a fake parameter's type is `FakeTensor` (torch's `Parameter` keeps a
    tensor subclass's type), so that call makes a `Parameter`; and `dispatch_model` keys tied
    parameters by `data_ptr()`, which is 0 for every fake tensor, so it is the object's identity
    (tied parameters are one object, as `find_tied_parameters` finds them). Data-dependent
    shapes (transformers 4.x's loop over the experts a batch hit, `nonzero`) cannot run fake."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    made = FakeTensor.__new__

    def new(cls, *args, **kwargs):
        if len(args) == 1 and isinstance(args[0], torch.Tensor) and set(kwargs) <= {"requires_grad"}:
            return torch.nn.Parameter(args[0], requires_grad=kwargs.get("requires_grad", True))
        return made(cls, *args, **kwargs)

    FakeTensor.__new__ = staticmethod(new)
    FakeTensor.data_ptr = lambda self: id(self)
    # transformers' MoE experts choose `torch._grouped_mm` by the GPU's compute capability; the
    # fake GPUs are taken to be H100s (9.0), as the device runs this harness on, unless the caller
    # answers for them itself (`capability=None`: the script harness gives each profile GPU's).
    if capability is not None:
        torch.cuda.get_device_capability = lambda device=None: capability
    # PEFT moves each new adapter to its base layer's device with `Module.to`, which for a fake
    # parameter swaps the old and new tensors (`torch.utils.swap_tensors`); that refuses a
    # tensor with a weak reference, and FakeTensorMode keeps one to every fake tensor it made.
    # The swap itself is what `.to` does to a real parameter (a parameter on the new device in
    # its place), so only the weak-reference check is skipped, and only in torch.utils.
    import types
    import weakref

    torch.utils.weakref = types.SimpleNamespace(getweakrefs=lambda tensor: [], ref=weakref.ref)
    return FakeTensorMode(allow_non_fake_inputs=True)


def build(request):
    config, _ = make_config(request["config"])
    cls = model_class(request["config"])
    dtype = DTYPES[request["dtype"]]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # Under fake devices the model is made whole (fake tensors hold no memory), as
        # `init_empty_weights`' meta tensors cannot be given fake values.
        with contextlib.nullcontext() if request.get("fake_gpus") else accelerate.init_empty_weights():
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator().manual_seed(0)
    for name, param in list(model.named_parameters()):
        if request.get("fake_gpus"):
            set_module_tensor_to_device(model, name, device_of(name, request["device_map"]))
            continue
        value = torch.randn(param.shape, generator=generator, dtype=torch.float32).mul_(0.02).to(param.dtype)
        set_module_tensor_to_device(model, name, device_of(name, request["device_map"]), value=value)
    for name, buf in list(model.named_buffers()):
        if request.get("fake_gpus"):
            set_module_tensor_to_device(model, name, device_of(name, request["device_map"]))
        elif buf.device.type == "meta":
            set_module_tensor_to_device(model, name, device_of(name, request["device_map"]),
                                        value=torch.zeros(buf.shape, dtype=buf.dtype))
    model.tie_weights()
    return model, config


def placed(model):
    """Bytes of the model's parameters and buffers per device, each storage once: where
    dispatch has put them (`meta` for weights offloaded to the CPU or disk)."""
    seen, where = set(), {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        key = str(tensor.device)
        where[key] = where.get(key, 0) + tensor.numel() * tensor.element_size()
    return dict(sorted(where.items()))


def devices_named(message):
    """The two devices of PyTorch's device-mismatch message."""
    found = re.search(r"found at least two devices, ([\w:]+) and ([\w:]+)", message)
    return list(found.groups()) if found else []


def main():
    request = json.load(open(sys.argv[1]))
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "accelerate": accelerate.__version__}
    fake = int(request.get("fake_gpus") or 0)
    cuda = torch.cuda.is_available() and not fake
    devices = list(range(torch.cuda.device_count())) if cuda else []
    needed = sorted({int(v) for v in request["device_map"].values() if isinstance(v, int) or str(v).isdigit()})
    if needed and needed[-1] >= (fake or len(devices)):
        print(json.dumps({"outcome": "no_device", "needed": needed, "found": fake or len(devices),
                          "message": f"the plan uses GPUs {needed}; torch sees {fake or len(devices)}"}))
        sys.exit(3)
    if devices:
        # The peak counters exist once CUDA is initialised ("Invalid device argument" before).
        torch.cuda.init()
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    running = []
    outcome, message, module, where = "completed", "", "", {}
    mode = fake_devices() if fake else contextlib.nullcontext()
    try:
        with mode:
            model, config = build(request)
            # "disk" runs as "cpu": the weights stream from host memory either way, and no
            # offload folder is needed for random weights.
            device_map = {k: (int(v) if isinstance(v, int) or str(v).isdigit() else "cpu")
                          for k, v in request["device_map"].items()}
            gpus = [v for v in device_map.values() if isinstance(v, int)]
            if gpus:
                model = accelerate.dispatch_model(model, device_map=device_map)
            where = placed(model)
            train = request["mode"] == "train"
            if request.get("grad_checkpointing") and train:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if request.get("lora") and train:
                import peft
                versions["peft"] = peft.__version__
                lora = request["lora"]
                targets = lora["targets"] or "all-linear"
                model = peft.get_peft_model(model, peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                                                                  target_modules=targets))

            def entered(module, args, name):
                running.append(name)

            def left(module, args, output, name):
                if running:
                    running.pop()

            for name, sub in model.named_modules():
                sub.register_forward_pre_hook(lambda m, a, n=name: entered(m, a, n))
                sub.register_forward_hook(lambda m, a, o, n=name: left(m, a, o, n))
            model.train(train)
            first = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
            vocab = config.get_text_config().vocab_size
            generator = torch.Generator().manual_seed(1)
            ids = torch.randint(0, vocab, (request["batch"], request["seq"]), generator=generator).to(first)
            if train:
                named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
                trainable = [p for _, p in named]
                # The HF Trainer's default optimizer (`adamw_torch_fused`), where every
                # parameter it steps is on a GPU (the fused kernel has no CPU path for mixed
                # devices).
                fused = bool(trainable) and all(p.is_cuda for p in trainable) and not fake
                optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=fused)
                for step in range(max(1, request.get("steps", 2))):
                    running.clear()
                    loss = model(input_ids=ids, labels=ids).loss
                    if fake:
                        # autograd's engine asks the CUDA driver for each device's context, so
                        # a backward cannot run on fake devices: the step is the forward with
                        # its loss, and the parameters accelerate's offload left on meta are
                        # those whose gradient goes to a streamed copy.
                        untrained = [n for n, p in named if p.device.type == "meta"]
                    else:
                        loss.backward()
                        # On meta: weights the offload streams (a weight a plain step does not
                        # use, such as XLNet's `mask_emb`, gets no gradient either).
                        untrained = [n for n, p in named if p.grad is None and p.device.type == "meta"]
                    if step == 0 and untrained:
                        outcome, module = "not_trained", untrained[0].rsplit(".", 1)[0]
                        message = (f"{len(untrained)} of {len(named)} trainable parameters get no gradient "
                                   f"(accelerate's offload streams a new copy of them for each forward, and "
                                   f"the gradient goes to the copy), {untrained[0]} first")
                        break
                    if not fake:
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    model(input_ids=ids, use_cache=True, logits_to_keep=1)
    except torch.OutOfMemoryError as e:
        outcome, message = "out_of_memory", str(e)
    except RuntimeError as e:
        text = str(e)
        outcome = "device_mismatch" if "Expected all tensors to be on the same device" in text else "error"
        message = text
    except Exception as e:  # noqa: BLE001
        outcome, message = "error", f"{type(e).__name__}: {e}"
    if outcome not in ("completed", "not_trained"):
        module = running[-1] if running else ""
    # PEFT's wrapper names every module `base_model.model.<name>`; the plan names the model's.
    module = module.removeprefix("base_model.model.")
    report = []
    for d in devices:
        free, total = torch.cuda.mem_get_info(d)
        report.append({"device": d, "name": torch.cuda.get_device_name(d),
                       "allocated_bytes": torch.cuda.max_memory_allocated(d),
                       "reserved_bytes": torch.cuda.max_memory_reserved(d),
                       "driver_used_bytes": total - free})
    print(json.dumps({"outcome": outcome, "message": message[:2000], "module": module,
                      "mismatched": devices_named(message) if outcome == "device_mismatch" else [],
                      "placed": where, "devices": report, "versions": versions}))


if __name__ == "__main__":
    main()
