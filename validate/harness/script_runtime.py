"""What the libraries around a training step do, as the script harness runs them: the steps
counted and the run stopped, `from_pretrained` without weights (4-bit weights as bitsandbytes
holds them, built-in models by their Hub id, `generate()` as one forward pass), savers that write
nothing, a fake process group and one rank's DDP, threads, and the current device."""

import json
import os
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from script_fake import CURRENT, ROUTER, index_of
from script_state import MODULES, REQUEST, RUN, STEPS, GenerationDone, StopRun, user_frame

# --- steps -------------------------------------------------------------------------------------------

def install_step_counting():
    init = torch.optim.Optimizer.__init__

    def counted_init(self, *args, **kwargs):
        RUN.optimizers += 1
        return init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = counted_init
    # Optimizers take their foreach (or fused) kernels for tensors of these exact types on CUDA, as
    # a real run on a GPU does; fake tensors are such tensors here.
    from torch.optim import optimizer as optimizer_module
    from torch.utils import _foreach_utils

    for kinds in (optimizer_module._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if FakeTensor not in kinds:
            kinds.append(FakeTensor)

    def before_step(optimizer, args, kwargs):
        RUN.enter_phase("optimizer")

    def after_step(optimizer, args, kwargs):
        # Steps of the first optimizer that steps: a GAN's two optimizers, or one per parameter
        # stepped from backward hooks, each step once per iteration.
        if RUN.stepper is None:
            RUN.stepper = weakref.ref(optimizer)
        if RUN.stepper() is not optimizer:
            return
        RUN.steps += 1
        RUN.progress(force=True)
        if RUN.steps >= STEPS:
            raise StopRun()

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    torch.nn.modules.module.register_module_forward_pre_hook(MODULES.enter)
    call = torch.nn.Module._call_impl

    def call_impl(self, *args, **kwargs):
        if not MODULES.stack:
            MODULES.top_kwargs = kwargs
        return call(self, *args, **kwargs)

    torch.nn.Module._call_impl = call_impl
    torch.nn.modules.module.register_module_forward_hook(MODULES.leave)


# --- from_pretrained without weights -------------------------------------------------------------------

def install_weightless_loading():
    try:
        import transformers.modeling_utils as mu
    except Exception:  # noqa: BLE001
        return
    resolve = mu._get_resolved_checkpoint_files

    def resolve_local(*args, **kwargs):
        # A local folder's checkpoint files are found (their headers give `dtype="auto"` its
        # answer; no weight is read); anything else would be downloaded, so nothing is resolved.
        path = kwargs.get("pretrained_model_name_or_path", args[0] if args else None)
        if path is not None and os.path.isdir(str(path)):
            try:
                return resolve(*args, **kwargs)
            except Exception:  # noqa: BLE001
                pass
        return None, None

    mu._get_resolved_checkpoint_files = resolve_local
    get_dtype = mu._get_dtype

    def dtype_without_weights(dtype, checkpoint_files, config, sharded_metadata, state_dict, *args, **kwargs):
        # `dtype="auto"` (the default) with no checkpoint and no dtype in the config: the default
        # dtype, as transformers takes where nothing says otherwise.
        if dtype == "auto" and checkpoint_files is None and state_dict is None and getattr(config, "dtype", None) is None:
            dtype = None
        return get_dtype(dtype, checkpoint_files, config, sharded_metadata, state_dict, *args, **kwargs)

    mu._get_dtype = dtype_without_weights
    original = mu.PreTrainedModel.from_pretrained.__func__
    load = mu.PreTrainedModel._load_pretrained_model

    def load_nothing(model, state_dict, checkpoint_files, load_config, *args, **kwargs):
        # An empty state dict and no files: every weight is a missing key, placed and initialised by
        # transformers (a local checkpoint's weights are never read).
        return load(model, {}, None, load_config, *args, **kwargs)

    mu.PreTrainedModel._load_pretrained_model = staticmethod(load_nothing)
    move = mu.PreTrainedModel._move_missing_keys_from_meta_to_device

    def move_missing(self, missing_keys, device_map, device_mesh, hf_quantizer):
        # Quantized linears get their weights as bitsandbytes stores them once quantized, on their
        # device; the rest as transformers places missing keys.
        quantized = quantized_weights(self, missing_keys, device_map)
        return move(self, set(missing_keys) - quantized, device_map, device_mesh, hf_quantizer)

    mu.PreTrainedModel._move_missing_keys_from_meta_to_device = move_missing

    def from_pretrained(cls, *args, **kwargs):
        ROUTER.fake_everything += 1
        try:
            return original(cls, *args, **kwargs)
        finally:
            ROUTER.fake_everything -= 1

    mu.PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    # A Hub id of one of vramplan's built-in models is its built-in config.json (a local folder):
    # the config is the published one, and nothing is fetched.
    builtins = json.load(open(REQUEST["builtins"])) if REQUEST.get("builtins") else {}

    def local(path):
        key = str(path) if path is not None else ""
        return builtins.get(key, path) if key and not os.path.exists(key) else path

    def from_builtin(original_method):
        def method(cls, path, *args, **kwargs):
            return original_method(cls, local(path), *args, **kwargs)
        return classmethod(method)

    mu.PreTrainedModel.from_pretrained = from_builtin(mu.PreTrainedModel.from_pretrained.__func__)
    import transformers.configuration_utils as cu
    from transformers.models.auto import auto_factory

    cu.PretrainedConfig._get_config_dict = from_builtin(cu.PretrainedConfig._get_config_dict.__func__)
    auto = auto_factory._BaseAutoModelClass
    auto.from_pretrained = from_builtin(auto.from_pretrained.__func__)

    # A `generate()` call is one forward pass of the script (its tokens are the model's).
    try:
        from transformers.generation.utils import GenerationMixin
    except Exception:  # noqa: BLE001
        return
    from transformers.generation import stopping_criteria

    generate = GenerationMixin.generate
    at_max_length = stopping_criteria.MaxLengthCriteria.__call__

    def max_length_reached(self, input_ids, scores, **kwargs):
        # Decoding stops when every sequence is finished, which it reads from a tensor's values; a
        # fake run has none, so it ends where the length does (the longest, most memory).
        if MODULES.generating and input_ids.shape[1] >= self.max_length:
            raise GenerationDone(input_ids)
        return at_max_length(self, input_ids, scores, **kwargs)

    stopping_criteria.MaxLengthCriteria.__call__ = max_length_reached

    def counted_generate(self, *args, **kwargs):
        outer = MODULES.generating
        MODULES.generating = True
        try:
            out = generate(self, *args, **kwargs)
        except GenerationDone as done:
            if outer:
                raise
            out = done.args[0]
        finally:
            MODULES.generating = outer
        if not outer:
            MODULES.forward_done()
        return out

    GenerationMixin.generate = counted_generate


def quantized_weights(model, missing_keys, device_map):
    """Gives every bitsandbytes 4-bit linear among `missing_keys` the weight bitsandbytes holds
    after quantizing (`Params4bit` on its device): the packed 4-bit values, `quant_storage`
    elements holding two values per byte, shape [(out*in+1)//2 / itemsize, 1]; per block of
    `blocksize` values an absmax, with double quantization (`compress_statistics`) a uint8 absmax
    per block plus an fp32 absmax per 256 blocks and a 256-entry code, else an fp32 absmax; a
    16-entry code. A plain parameter carries them (a `Params4bit` cannot wrap a fake tensor), with
    the attributes bitsandbytes and PEFT read. Returns the keys it placed. 8-bit (LLM.int8)
    weights are refused: their forward is not run under fake GPUs."""
    try:
        import bitsandbytes as bnb
        from bitsandbytes.functional import QuantState
    except Exception:  # noqa: BLE001
        return set()
    from transformers.integrations.accelerate import get_device

    placed = set()
    for key in missing_keys:
        if not key.endswith(".weight"):
            continue
        module = model.get_submodule(key.rsplit(".", 1)[0])
        if isinstance(module, bnb.nn.Linear8bitLt):
            raise NotImplementedError(
                "vramplan validate --script runs 4-bit bitsandbytes models (load_in_4bit) on fake GPUs, not 8-bit "
                "(load_in_8bit): LLM.int8's kernels have no fake implementation to run without a GPU")
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        weight = module.weight
        device = get_device(device_map, key, valid_torch_device=True)
        out_f, in_f = module.out_features, module.in_features
        n = out_f * in_f
        blocksize = getattr(weight, "blocksize", None) or 64
        storage = getattr(weight, "quant_storage", torch.uint8)
        quant_type = getattr(weight, "quant_type", "fp4")
        compress = getattr(weight, "compress_statistics", True)
        blocks = -(-n // blocksize)
        if compress:
            state2 = QuantState(absmax=torch.empty(-(-blocks // 256), dtype=torch.float32, device=device),
                                code=torch.empty(256, dtype=torch.float32, device=device), blocksize=256,
                                quant_type=quant_type, dtype=torch.float32)
            absmax, offset = torch.empty(blocks, dtype=torch.uint8, device=device), torch.empty(
                (), dtype=torch.float32, device=device)
        else:
            state2, offset = None, None
            absmax = torch.empty(blocks, dtype=torch.float32, device=device)
        compute = module.compute_dtype or torch.float32
        state = QuantState(absmax=absmax, shape=torch.Size([out_f, in_f]),
                           code=torch.empty(16, dtype=torch.float32, device=device), blocksize=blocksize,
                           quant_type=quant_type, dtype=compute, offset=offset, state2=state2)
        bytes_ = (n + 1) // 2
        packed = torch.nn.Parameter(torch.empty(-(-bytes_ // storage.itemsize), 1, dtype=storage, device=device),
                                    requires_grad=False)
        packed.quant_state, packed.bnb_quantized, packed.module = state, True, module
        packed.compress_statistics, packed.quant_type, packed.quant_storage, packed.blocksize = (
            compress, quant_type, storage, blocksize)
        packed._is_hf_initialized = True
        module._parameters["weight"] = packed
        module.quant_state = state
        placed.add(key)
    return placed


# --- distributed ----------------------------------------------------------------------------------------

def install_fake_process_group():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    real_init = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        kwargs.pop("store", None)
        kwargs.pop("init_method", None)
        kwargs["rank"] = int(os.environ.get("RANK", "0"))
        kwargs["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
        return real_init("fake", *args, store=FakeStore(), **kwargs)

    dist.init_process_group = init_process_group
    install_ddp()


def install_current_device():
    """`tensor.to("cuda")` and `.cuda()` go to the current device (`torch.cuda.set_device`), as on
    a GPU; PyTorch's C++ fills the index from its CUDA device guard, which knows nothing of the fake
    devices' current one, so the index is given here first."""
    def current(device):
        if isinstance(device, str) and device == "cuda":
            return torch.device("cuda", CURRENT["device"])
        if isinstance(device, torch.device) and device.type == "cuda" and device.index is None:
            return torch.device("cuda", CURRENT["device"])
        return device

    to, cuda = torch.Tensor.to, torch.Tensor.cuda

    def tensor_to(self, *args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = current(kwargs["device"])
        return to(self, *[current(a) for a in args], **kwargs)

    def tensor_cuda(self, device=None, *args, **kwargs):
        return cuda(self, CURRENT["device"] if device is None else current(device), *args, **kwargs)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = tensor_cuda


def install_threads():
    """A thread the script starts runs under the same dispatch mode (modes are per thread), so
    its GPU tensors are fake too. `DataParallel` is refused with its reason: it copies the module
    to every GPU with CUDA's own broadcast, which has no fake implementation."""
    import threading

    run = threading.Thread.run

    def routed(self):
        with ROUTER:
            return run(self)

    threading.Thread.run = routed

    class RefusedDataParallel(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(
                "vramplan validate --script does not run torch.nn.DataParallel on fake GPUs (it broadcasts the "
                "module with CUDA's own copies); PyTorch recommends DistributedDataParallel, which --nproc runs")

    torch.nn.DataParallel = RefusedDataParallel
    torch.nn.parallel.DataParallel = RefusedDataParallel


def install_ddp():
    """`DistributedDataParallel` as one rank sees it, without its C++ reducer (which times and
    synchronises on real CUDA streams): the module's forward with the inputs moved to
    `device_ids[0]`, as DDP moves them, and the gradient buckets DDP allocates beside the gradients
    (one copy of every trainable parameter's gradient, in buckets of `bucket_cap_mb`, unless
    `gradient_as_bucket_view`), so a rank's memory holds what DDP adds. The all-reduce itself moves
    no data between a rank's devices."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    class RankDDP(DDP):
        def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                     process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                     gradient_as_bucket_view=False, static_graph=False, **kwargs):
            torch.nn.Module.__init__(self)
            self.module = module
            self.device_ids = list(device_ids) if device_ids else None
            self.output_device = output_device
            self.dim = dim
            self.process_group = process_group
            self.find_unused_parameters = find_unused_parameters
            self.gradient_as_bucket_view = gradient_as_bucket_view
            self.static_graph = static_graph
            self.require_backward_grad_sync = True
            self.require_forward_param_sync = True
            self._buckets = []
            if not gradient_as_bucket_view:
                trainable = [p for p in module.parameters() if p.requires_grad]
                groups = {}
                for p in trainable:
                    groups.setdefault((p.device, p.dtype), []).append(p)
                for (device, dtype), params in groups.items():
                    total = sum(p.numel() for p in params)
                    if total and device.type == "cuda":
                        self._buckets.append(torch.empty(total, dtype=dtype, device=device))

        def forward(self, *inputs, **kwargs):
            if self.device_ids:
                target = torch.device("cuda", index_of(self.device_ids[0]))

                def move(x):
                    return x.to(target) if isinstance(x, torch.Tensor) and x.device != target else x

                inputs, kwargs = pytree.tree_map(move, (inputs, kwargs))
            return self.module(*inputs, **kwargs)

        @contextlib.contextmanager
        def no_sync(self):
            yield

        def register_comm_hook(self, state, hook):
            pass

        def join(self, *args, **kwargs):
            return contextlib.nullcontext()

        def _set_static_graph(self):
            pass

    torch.nn.parallel.DistributedDataParallel = RankDDP
    torch.nn.parallel.distributed.DistributedDataParallel = RankDDP


def install_savers():
    """A fake run has no weights to save: `torch.save`, `save_pretrained` and safetensors' savers
    write nothing (a real checkpoint at that path is left as it is), and the run notes where."""
    def skipped(what):
        def save(*args, **kwargs):
            where = user_frame(sys._getframe(1))
            place = f"{where['file']}:{where['line']}" if where else "the script"
            RUN.note(f"{place}: {what} wrote nothing (a fake run has no weights to save)")
        return save

    torch.save = skipped("torch.save")
    try:
        import safetensors.torch as st

        st.save_file = skipped("safetensors' save_file")
        st.save_model = skipped("safetensors' save_model")
    except Exception:  # noqa: BLE001
        pass
    def patch(owner, cls):
        for name in ("save_pretrained", "save_model", "_save_checkpoint"):
            if hasattr(owner, name):
                setattr(owner, name, skipped(f"{cls}.{name}"))

    import transformers.modeling_utils

    patch(transformers.modeling_utils.PreTrainedModel, "PreTrainedModel")
    # PEFT and the Trainer take seconds to import: they are patched when the script imports them.
    when_imported("peft", lambda peft: patch(peft.PeftModel, "PeftModel"))
    when_imported("transformers.trainer", lambda trainer: patch(trainer.Trainer, "Trainer"))


def install_triton():
    """A Triton kernel launched on fake tensors does nothing: its Python wrapper has made its
    outputs already (fake, and counted), and the kernel only writes their values, which a fake run
    does not have. Autotuning and heuristics, which would time the kernel, are skipped the same way.
    So a library's Triton path (TRL's chunked log-probabilities, Liger, Unsloth) runs with the
    memory it has on a GPU."""
    def skip_on_fake(cls):
        run = cls.run

        def launch(self, *args, **kwargs):
            if any(isinstance(a, FakeTensor) for a in pytree.tree_leaves((args, kwargs))):
                RUN.cuda_ops += 1
                return None
            return run(self, *args, **kwargs)
        cls.run = launch

    when_imported("triton.runtime.jit", lambda jit: skip_on_fake(jit.JITFunction))

    def autotuner(module):
        for name in ("Autotuner", "Heuristics"):
            if hasattr(module, name):
                skip_on_fake(getattr(module, name))
    when_imported("triton.runtime.autotuner", autotuner)


def when_imported(name, then):
    """Calls `then(module)` once module `name` has been imported (now, if it is already)."""
    import importlib.abc
    import importlib.util

    if name in sys.modules:
        then(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                then(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())
