"""vramplan's script harness: runs a user's unmodified training or inference script on fake CUDA
devices and writes what happened as one JSON document (`vramplan validate --script`).

Written to a temporary folder (beside `run_plan.py`, whose `fake_devices()` it shares) and run
with the user's Python. The request (argv[1], a JSON file) names the script, its arguments, the
profile's GPUs (name, total and usable bytes, compute capability), the steps to run, this process's
rank and the world size, and where to write the result.

How the run is faked, and why each piece:
- The profile's GPUs are CUDA devices: `torch.cuda.is_available()`, `device_count()`,
  `get_device_name()`, `get_device_properties()`, `mem_get_info()` and the memory counters answer
  as those GPUs would. A tensor made on (or moved to) `cuda:N` is a `FakeTensor` (PyTorch's
  `FakeTensorMode`: shapes, dtypes and devices, no data, nothing allocated); a tensor on the CPU
  stays real unless it comes from a fake one. `Router`, a dispatch mode over the whole run, sends
  every operation that touches a fake tensor or makes one on a CUDA device into the fake mode.
- Every fake operation checks PyTorch's device rule (the fake mode's device propagation, the same
  rule the CUDA kernels check). The first violation is recorded with the innermost frame of the
  user's code, the operation, the two devices, the shapes and the module running, and raised as
  PyTorch raises it ("Expected all tensors to be on the same device ...").
- Backward: PyTorch's autograd engine cannot run over fake CUDA tensors in a process without a GPU
  (it asks the CUDA runtime for each device's primary context and streams; registering a
  PrivateUse1 device instead makes every CUDA node stream-less and trips the engine's stream
  assertion). So `backward()` over fake tensors is run by `backward_graph` below: the same graph
  (the `grad_fn` nodes the forward recorded), each node applied in the engine's order (highest
  sequence number first, gradient accumulation before anything else), gradients summed per input,
  `.grad` accumulated in place, and each node's saved tensors released once it has run, as the
  engine releases them without `retain_graph`. The device rule holds there too: each node's
  formulas run as fake operations.
- `from_pretrained` runs as transformers wrote it (config, dtype, quantizer, `device_map` by
  accelerate over the fake GPUs' free memory, dispatch hooks, tied weights), except that no
  checkpoint file is resolved or read: every weight is a missing key, which transformers places on
  its device and initialises — as fake tensors, since the loading is faked whole.
- Memory: every storage of a fake CUDA tensor from creation to death (weak references, sizes
  rounded to the caching allocator's 512 bytes, as PyTorch's MemTracker counts them), per device,
  with the peak and where it happened; the allocation sequence goes back to vramplan, whose
  allocator model turns it into reserved and device-used bytes. Allocated bytes over a device's
  usable memory stop the run with an out-of-memory answer at that moment.
- The run stops after `steps` steps of the first optimizer that steps (any
  `torch.optim.Optimizer`), or `steps` forward passes of the first top-level module (a
  `generate()` call counting as one) where the script makes no optimizer.
- Values: a fake tensor has none. `.item()`, `.tolist()`, `.numpy()`, `bool()` and printing of
  fake tensors give zeros, and the first places that read one are listed as notes:
  data-dependent control flow follows that zero. `generate()` runs to its maximum length.
- What a real run on a GPU also does: tensor hooks, `retain_grad`, post-accumulate hooks and
  `torch.autograd.grad` run in the backward; an allocation past a GPU's usable memory raises
  `torch.OutOfMemoryError`, which the script may catch; threads the script starts run fake too;
  `module.to("cuda")` keeps each parameter object; savers write nothing (notes say where).
- `real` in the request runs the script on this machine's GPUs instead (the same stop rule and
  report, PyTorch's own counters), to check a fake run against a real one.
"""

import contextlib
import json
import os
import runpy
import sys
import sysconfig
import time
import traceback
import weakref

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))


def fail(outcome, message, code=3, **fields):
    print(json.dumps({"outcome": outcome, "message": message, **fields}))
    sys.exit(code)


try:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils import _pytree as pytree
    from torch.utils.weak import WeakIdKeyDictionary
except Exception as e:  # noqa: BLE001
    fail("missing_library", f"{type(e).__name__}: {e}")

REQUEST = json.load(open(sys.argv[1]))
SCRIPT = os.path.abspath(REQUEST["script"])
GPUS = REQUEST["gpus"]
STEPS = max(1, int(REQUEST.get("steps") or 2))
ROUND = 512
LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
              HARNESS_DIR, os.path.dirname(torch.__file__)}
)


class StopRun(BaseException):
    """Ends the script once its steps are done (a BaseException, so `except Exception` in the
    script does not swallow it)."""


class GenerationDone(BaseException):
    """Ends a `generate()` call at its maximum length (its tokens so far are the answer)."""


# --- where in the user's code -------------------------------------------------------------------

def is_user_file(filename):
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if "site-packages" in real or "dist-packages" in real:
        return False
    return not real.startswith(LIBRARY_DIRS)


def user_frame(frame=None):
    """The innermost frame of the user's code on the current stack: {file, line, function}."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return {"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}
        frame = frame.f_back
    return None


def traceback_user_frame(tb):
    """The innermost user frame of a traceback."""
    found = None
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            found = {"file": tb.tb_frame.f_code.co_filename, "line": tb.tb_lineno,
                     "function": tb.tb_frame.f_code.co_name}
        tb = tb.tb_next
    return found


# --- modules running ------------------------------------------------------------------------------

class Modules:
    """The stack of modules running, by the names of the outermost module's `named_modules`."""

    def __init__(self):
        self.stack = []
        self.names = {}
        self.forwards = 0
        self.first = None
        self.paths = {}            # module -> its path from the outermost module ("" for it)
        self.measuring = None      # (batch, sequence) while the first training forward runs
        self.top_kwargs = {}       # the keyword arguments of the outermost call (hooks see none)
        self.generating = False    # inside transformers' generate(): one call is one forward pass

    def name(self, module):
        return self.names.get(id(module), type(module).__name__)

    def enter(self, module, args):
        if not self.stack:
            for name, sub in module.named_modules():
                self.names.setdefault(id(sub), name or type(module).__name__)
                self.paths.setdefault(id(sub), name.removeprefix("base_model.model."))
            if not RUN.in_backward:
                RUN.enter_phase("forward")
                if RUN.activations is None and torch.is_grad_enabled():
                    self.measuring = batch_and_sequence(args, self.top_kwargs)
                    MEMORY.creators = {}
        self.stack.append(module)

    def leave(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        elif module in self.stack:
            del self.stack[self.stack.index(module):]
        if not self.stack and not RUN.in_backward:
            RUN.enter_phase("loss")
            if self.measuring is not None:
                trains = any(isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves(output))
                if trains:
                    RUN.activations = held_for_backward(*self.measuring)
                self.measuring = None
                MEMORY.creators = None
        if not self.stack and self.first in (None, id(module)) and not self.generating:
            # Forward passes: calls of the first module the script called at the top level (a
            # script that calls its layers one by one counts the first layer's calls).
            self.first = id(module)
            self.forwards += 1
            RUN.progress()
            if not RUN.optimizers and self.forwards >= STEPS and not RUN.in_backward:
                raise StopRun()

    def current_path(self):
        """The path of the innermost module running, from the outermost (None outside any)."""
        return self.paths.get(id(self.stack[-1])) if self.stack else None

    def current(self):
        if not self.stack:
            return ""
        name = self.name(self.stack[-1])
        # PEFT's wrapper names every module `base_model.model.<name>`.
        return name.removeprefix("base_model.model.")


# --- the run's state ------------------------------------------------------------------------------

class Run:
    def __init__(self):
        self.optimizers = 0
        self.steps = 0
        self.stepper = None        # the first optimizer that stepped (weak reference)
        self.ooms = 0              # allocations refused as out of memory
        self.in_backward = False
        self.graph_task = -1       # the backward running (torch._C._current_graph_task_id)
        self.graph_tasks = 0
        self.mismatch = None
        self.oom = None
        self.cuda_ops = 0
        self.cpu_ops = 0
        self.notes = []
        self.started = time.monotonic()
        self.last_progress = 0.0
        self.activations = None    # what the first training forward left for backward
        self.phase = ("load", 0)
        self.phase_marks = [[0, "load", 0]]

    def progress(self, force=False):
        now = time.monotonic()
        if REQUEST.get("progress") and (force or now - self.last_progress > 0.5):
            self.last_progress = now
            sys.stderr.write(f"\x1evramplan-progress rank={REQUEST.get('rank', 0)} steps={self.steps} "
                             f"forwards={MODULES.forwards} module={MODULES.current()}\n")
            sys.stderr.flush()

    def enter_phase(self, phase):
        """The run is in `phase` (load, forward, loss, backward, optimizer) from the next allocation
        on; the marks go back with the allocations, for the timeline."""
        step = self.steps + 1 if phase != "load" else 0
        if self.phase != (phase, step):
            self.phase = (phase, step)
            self.phase_marks.append([len(MEMORY.events), phase, step])

    def note(self, text):
        if len(self.notes) < 5 and text not in self.notes:
            self.notes.append(text)


RUN = Run()
MODULES = Modules()


# --- activations a training forward leaves for backward ---------------------------------------------

def batch_and_sequence(args, kwargs):
    """The batch and sequence length of a forward's input: the first tensor among `input_ids`,
    `inputs_embeds`, then the positional arguments; a sequence only where the tensor has one (ids
    [batch, seq], or [batch, seq, features])."""
    candidates = [kwargs.get("input_ids"), kwargs.get("inputs_embeds")] + list(args) + list(kwargs.values())
    for t in candidates:
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            seq = t.shape[1] if t.dim() >= 3 or (t.dim() == 2 and not t.dtype.is_floating_point) else None
            return int(t.shape[0]), (int(seq) if seq is not None else None)
    return None, None


def held_for_backward(batch, seq):
    """Per module (its path from the outermost module, "" for it), the bytes of GPU storages made
    while it was the innermost module running that are still alive when the forward returns:
    what autograd keeps for backward (and the outputs), each module's total with its
    submodules'."""
    modules = {}
    for path, size in MEMORY.creators.values():
        parts = path.split(".") if path else []
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            modules[prefix] = modules.get(prefix, 0) + size
    return {"batch": batch, "seq": seq, "modules": modules}


# --- memory ---------------------------------------------------------------------------------------

class Memory:
    """Live bytes of every fake CUDA storage, per device, and the allocation sequence."""

    def __init__(self, devices):
        self.live = [0] * devices
        self.peak = [0] * devices
        self.peak_at = [None] * devices
        self.peak_module = [""] * devices
        self.events = []          # [device, id, bytes]: bytes > 0 allocates id, 0 frees it
        self.next_id = 1
        self.seen = weakref.WeakKeyDictionary()
        self.limit = [g["usable_bytes"] for g in GPUS]
        self.creators = None   # while measuring activations: live storage -> (module path, bytes)
        self.total = 0         # live bytes over all devices
        self.peak_total = 0

    def track(self, tensor):
        if not isinstance(tensor, FakeTensor) or tensor.device.type != "cuda":
            return
        storage = tensor.untyped_storage()
        if storage in self.seen:
            return
        device = tensor.device.index or 0
        if device >= len(GPUS):
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{device} on a profile of {len(GPUS)} "
                               f"GPU{'' if len(GPUS) == 1 else 's'})")
        size = storage.nbytes()
        size = max(ROUND, -(-size // ROUND) * ROUND) if size else 0
        ident = self.next_id
        self.next_id += 1
        self.seen[storage] = ident
        if self.live[device] + size > self.limit[device]:
            # The allocation PyTorch refuses: it never exists, so it is neither counted nor
            # replayed, and the script may catch the error and go on (a batch-size finder does).
            where = user_frame()
            if RUN.oom is None:
                RUN.oom = {"device": device, "location": where, "module": MODULES.current(),
                           "allocated_bytes": self.live[device], "usable_bytes": self.limit[device],
                           "requested_bytes": size}
            RUN.ooms += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size / 2**20:.2f} MiB. GPU {device} (vramplan's fake "
                f"{GPUS[device]['name']}) has {self.limit[device] / 2**30:.2f} GiB usable by PyTorch, of which "
                f"{self.live[device] / 2**30:.2f} GiB is allocated.")
        if self.creators is not None:
            path = MODULES.current_path()
            if path is not None:
                self.creators[ident] = (path, size)
        self.live[device] += size
        self.total += size
        self.peak_total = max(self.peak_total, self.total)
        self.events.append([device, ident, size])
        weakref.finalize(storage, self.freed, device, ident, size)
        if self.live[device] > self.peak[device]:
            self.peak[device] = self.live[device]
            self.peak_at[device] = user_frame()
            self.peak_module[device] = MODULES.current()

    def freed(self, device, ident, size):
        if self.creators is not None:
            self.creators.pop(ident, None)
        self.live[device] -= size
        self.total -= size
        self.events.append([device, ident, 0])


MEMORY = Memory(len(GPUS))


# --- fake CUDA ------------------------------------------------------------------------------------

CURRENT = {"device": 0}
FAKE = None


def make_fake_mode():
    """The fake mode, made once `torch.cuda` answers as the profile (run_plan imports transformers and
    accelerate, which read `torch.cuda.is_available()` once)."""
    global FAKE
    sys.path.insert(0, HARNESS_DIR)
    from run_plan import fake_devices

    FAKE = fake_devices()
    # The fake mode must never touch the CUDA runtime (there may be none): it asks
    # `torch.cuda.is_available()`, which answers for the profile's GPUs here, so it is told directly.
    type(FAKE).avoid_device_init = property(lambda self: True)
    torch._C._ensureCUDADeviceGuardSet()
    # `torch.tensor(data, device="cuda")` makes the tensor on the CPU and moves it where the modes see
    # the move (otherwise the copy goes to the CUDA runtime under them).
    torch._C._set_only_lift_cpu_tensors(True)
    # `module.to("cuda")` keeps each parameter object, as on a real GPU (where the data moves
    # under the same `Parameter`): an optimizer made before the move steps the moved tensors. A
    # real CPU parameter cannot take a fake tensor's data, so the two are swapped instead.
    torch.__future__.set_swap_module_params_on_conversion(True)


def index_of(device):
    if device is None:
        return CURRENT["device"]
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return CURRENT["device"] if device.index is None else device.index
    return int(device)


class DeviceProperties:
    """What `torch.cuda.get_device_properties` says of a profile GPU."""

    def __init__(self, gpu):
        self.name = gpu["name"]
        self.total_memory = gpu["total_bytes"]
        self.major, self.minor = gpu["capability"]
        self.multi_processor_count = gpu.get("multiprocessors", 80)
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.gcnArchName = ""
        self.uuid = f"GPU-vramplan-{gpu['name']}"
        self.L2_cache_size = 40 * 2**20
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})")


class device_guard:
    """`torch.cuda.device(i)`: a context that makes `i` current."""

    def __init__(self, device):
        self.index = index_of(device)

    def __enter__(self):
        self.previous = CURRENT["device"]
        CURRENT["device"] = self.index

    def __exit__(self, *exc):
        CURRENT["device"] = self.previous
        return False


class Event:
    def __init__(self, *args, **kwargs):
        self.at = time.perf_counter()

    def record(self, *args, **kwargs):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def wait(self, *args, **kwargs):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return (other.at - self.at) * 1000.0


class Stream:
    def __init__(self, device=None, *args, **kwargs):
        self.device = torch.device("cuda", index_of(device))

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or Event()

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def install_fake_cuda():
    cuda = torch.cuda
    count = len(GPUS)

    def checked(device):
        i = index_of(device)
        if not 0 <= i < count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (the profile has {count} GPUs, asked for {i})")
        return i

    def set_device(device):
        CURRENT["device"] = checked(device)

    def mem_get_info(device=None):
        i = checked(device)
        total = GPUS[i]["total_bytes"]
        return max(0, GPUS[i]["usable_bytes"] - MEMORY.live[i]), total

    cuda.is_available = lambda: count > 0
    cuda.device_count = lambda: count
    cuda.is_initialized = lambda: True
    cuda._lazy_init = lambda: None
    cuda.init = lambda: None
    cuda.current_device = lambda: CURRENT["device"]
    cuda.set_device = set_device
    cuda.device = device_guard
    cuda.device_of = lambda tensor: device_guard(tensor.device)
    cuda.get_device_name = lambda device=None: GPUS[checked(device)]["name"]
    cuda.get_device_properties = lambda device=None: DeviceProperties(GPUS[checked(device)])
    cuda.get_device_capability = lambda device=None: tuple(GPUS[checked(device)]["capability"])
    # As torch answers: bf16 natively from compute capability 8.0, emulated before it.
    cuda.is_bf16_supported = lambda including_emulation=True: (
        including_emulation or GPUS[CURRENT["device"]]["capability"][0] >= 8)
    cuda.mem_get_info = mem_get_info
    cuda.memory.mem_get_info = mem_get_info
    cuda.memory_allocated = lambda device=None: MEMORY.live[checked(device)]
    cuda.max_memory_allocated = lambda device=None: MEMORY.peak[checked(device)]
    cuda.memory_reserved = lambda device=None: MEMORY.live[checked(device)]
    cuda.max_memory_reserved = lambda device=None: MEMORY.peak[checked(device)]
    cuda.reset_peak_memory_stats = lambda device=None: None
    cuda.reset_max_memory_allocated = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.synchronize = lambda device=None: None
    cuda.manual_seed = lambda seed: None
    cuda.manual_seed_all = lambda seed: None
    cuda.seed = lambda: None
    cuda.seed_all = lambda: None
    cuda.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)
    cuda.set_rng_state = lambda state, device="cuda": None
    cuda.get_rng_state_all = lambda: [torch.zeros(16, dtype=torch.uint8) for _ in range(count)]
    cuda.set_rng_state_all = lambda states: None
    cuda.Event = Event
    cuda.Stream = Stream
    cuda.current_stream = lambda device=None: Stream(device)
    cuda.default_stream = lambda device=None: Stream(device)
    cuda.stream = lambda stream=None: Stream()
    cuda.memory_summary = lambda device=None, abbreviated=False: f"vramplan fake GPU {checked(device)}: " \
        f"{MEMORY.live[checked(device)]} bytes allocated"
    cuda.memory_stats = lambda device=None: {"allocated_bytes.all.current": MEMORY.live[checked(device)],
                                             "allocated_bytes.all.peak": MEMORY.peak[checked(device)]}
    if hasattr(torch, "accelerator"):
        acc = torch.accelerator
        acc.is_available = lambda: count > 0
        acc.device_count = lambda: count
        acc.current_accelerator = lambda check_available=False: torch.device("cuda")
        acc.current_device_index = lambda: CURRENT["device"]
        acc.set_device_index = set_device
        acc.synchronize = lambda device=None: None
        if hasattr(acc, "memory"):
            acc.memory.empty_cache = lambda: None
    torch._C._cuda_getDeviceCount = lambda: count


# --- values a fake tensor does not have -------------------------------------------------------------

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


def install_value_reads():
    def noted(what, tensor):
        where = user_frame(sys._getframe(2))
        if where:
            RUN.note(f"{where['file']}:{where['line']} reads a value ({what}) of a tensor on {tensor.device}: "
                     f"fake tensors have none, so it read 0 and the code after it followed that")

    item, tolist, as_bool, fmt = torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__format__

    def fake_item(self):
        if isinstance(self, FakeTensor):
            noted("item()", self)
            return zero_of(self)
        return item(self)

    def fake_tolist(self):
        if isinstance(self, FakeTensor):
            noted("tolist()", self)
            return torch.zeros(self.shape, dtype=self.dtype).tolist()
        return tolist(self)

    def fake_bool(self):
        if isinstance(self, FakeTensor):
            noted("bool()", self)
            return False
        return as_bool(self)

    def fake_format(self, spec):
        if isinstance(self, FakeTensor) and self.dim() == 0:
            return format(zero_of(self), spec)
        return fmt(self, spec)

    as_numpy = torch.Tensor.numpy

    def fake_numpy(self, *args, **kwargs):
        if isinstance(self, FakeTensor):
            noted("numpy()", self)
            return torch.zeros(self.shape, dtype=self.dtype).numpy()
        return as_numpy(self, *args, **kwargs)

    torch.Tensor.numpy = fake_numpy
    # Pinned host memory needs the CUDA runtime; pinning changes no device and no GPU memory.
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    torch.Tensor.is_pinned = lambda self, *args, **kwargs: False
    torch.Tensor.item = fake_item
    torch.Tensor.tolist = fake_tolist
    torch.Tensor.__bool__ = fake_bool
    torch.Tensor.__format__ = fake_format
    FakeTensor.__repr__ = lambda self, *a, **k: (
        f"tensor(<no values: {tuple(self.shape)} {str(self.dtype).removeprefix('torch.')} on {self.device}, "
        f"vramplan fake GPU>)")


# --- the dispatch mode --------------------------------------------------------------------------------

MISMATCH = ("found two different devices", "Expected all tensors to be on the same device",
            "found at least two devices")


LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


def zero_of(tensor):
    """The value a fake tensor is read as."""
    if tensor.dtype == torch.bool:
        return False
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return 0.0
    return 0


def on_meta(device, leaves):
    """Whether an operation makes or works on meta tensors (a model built empty, by
    `init_empty_weights`, stays on meta while it loads)."""
    if device is not None:
        return str(device) == "meta"
    return any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in leaves)


def on_cuda_device(value):
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.startswith("cuda")
    return False


class Router(TorchDispatchMode):
    """Sends every operation that touches a fake tensor or makes one on a CUDA device through the fake
    mode; the rest runs for real. Records mismatches and tracks memory."""

    def __init__(self):
        super().__init__()
        self.fake_everything = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        leaves = pytree.tree_leaves((args, kwargs))
        fake = any(isinstance(t, FakeTensor) for t in leaves) or on_cuda_device(kwargs.get("device")) or (
            self.fake_everything and not on_meta(kwargs.get("device"), leaves))
        if not fake:
            RUN.cpu_ops += 1
            return func(*args, **kwargs)
        if func is LOCAL_SCALAR and isinstance(args[0], FakeTensor):
            # A value read below Python (`.item()` from C++, as DDP's parameter check does): zero.
            return zero_of(args[0])
        try:
            with FAKE:
                out = func(*args, **kwargs)
        except RuntimeError as error:
            text = str(error)
            if any(m in text for m in MISMATCH):
                self.mismatch(func, leaves, text)
            raise
        outs = pytree.tree_leaves(out)
        if any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in leaves + outs):
            RUN.cuda_ops += 1
        for t in outs:
            if isinstance(t, torch.Tensor):
                MEMORY.track(t)
        return out

    def mismatch(self, func, leaves, text):
        if RUN.mismatch is not None:
            return
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        devices = []
        for t in tensors:
            name = str(t.device)
            if name not in devices:
                devices.append(name)
        RUN.mismatch = {
            "operation": str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func),
            "devices": devices[:2],
            "shapes": [[list(t.shape), str(t.device)] for t in tensors][:6],
            "module": MODULES.current(),
            "location": user_frame(),
            "phase": "backward" if RUN.in_backward else "forward",
            "message": text[:500],
        }


ROUTER = Router()


# --- backward without the engine ----------------------------------------------------------------------

class Saved:
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


UNPACKED = []


def pack(tensor):
    return Saved(tensor)


CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")


def unpack(saved):
    if saved.tensor is None:
        raise RuntimeError(
            "Trying to backward through the graph a second time (or directly access saved tensors after they "
            "have already been freed). Saved intermediate values of the graph are freed when you call "
            ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph "
            "a second time or if you need to access saved tensors after calling backward.")
    # A checkpointed region's inputs, unpacked to recompute it from inside another node, belong to
    # the checkpoint's own node, which releases them when it runs. The walk stops at the backward
    # running: a reentrant checkpoint's own backward (inside checkpoint.py) is not a recompute.
    frame, recomputing = sys._getframe(1), False
    for _ in range(4):
        if frame is None or frame.f_code is backward_graph.__code__:
            break
        if frame.f_code.co_filename.endswith(CHECKPOINT_FILE):
            recomputing = True
            break
        frame = frame.f_back
    if not recomputing:
        UNPACKED.append(saved)
    return saved.tensor


def is_accumulate(node):
    return type(node).__name__ == "AccumulateGrad"


NODE_HOOKS = {}                              # grad_fn -> {output_nr: [hook]}: non-leaf tensors' hooks
# Keyed by identity: a tensor's `==` is elementwise (and a fake tensor's truth value is no answer).
LEAF_HOOKS = WeakIdKeyDictionary()           # leaf tensor -> [hook] on its gradient
POST_HOOKS = WeakIdKeyDictionary()           # leaf tensor -> [hook] after its gradient accumulated


def hooked(hooks, grad):
    """A gradient through tensor hooks, as the engine applies them (a hook may return a new one)."""
    for hook in hooks:
        new = hook(grad)
        if new is not None:
            grad = new
    return grad


def backward_graph(roots, grads, retain_graph=False, create_graph=False, capture=None):
    """Runs the backward of `roots` (with their `grads`) node by node, as autograd's engine does.
    With `capture` (`torch.autograd.grad`): a dict of (id of node, slot) or id of leaf -> index whose
    gradients are returned instead of accumulated, and no `.grad` is touched."""
    import heapq

    captured = {}

    dependencies, stack, seen = {}, [r.grad_fn for r in roots if r.grad_fn is not None], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if child is not None:
                dependencies[child] = dependencies.get(child, 0) + 1
                stack.append(child)
    buffers, ready, order = {}, [], 0

    def push(node):
        nonlocal order
        order += 1
        key = float("inf") if is_accumulate(node) else node._sequence_nr()
        heapq.heappush(ready, (-key, order, node))

    for root, grad in zip(roots, grads):
        node = root.grad_fn
        if node is None:
            if capture is not None and id(root) in capture:
                captured[capture[id(root)]] = grad
            elif root.requires_grad and capture is None:
                with torch.no_grad():
                    root.grad = grad if root.grad is None else root.grad.add_(grad)
            continue
        slot = buffers.setdefault(node, {})
        slot[root.output_nr] = grad if root.output_nr not in slot else slot[root.output_nr] + grad
    for node in {r.grad_fn for r in roots if r.grad_fn is not None}:
        if dependencies.get(node, 0) == 0:
            push(node)
    RUN.in_backward = True
    RUN.enter_phase("backward")
    # Checkpointing recomputes a region once per backward, keyed by the engine's graph task id
    # (which is -1 outside the engine, and then it recomputes at every unpack).
    RUN.graph_tasks += 1
    outer_task, RUN.graph_task = RUN.graph_task, RUN.graph_tasks
    try:
        while ready:
            _, _, node = heapq.heappop(ready)
            slot = buffers.pop(node, {})
            for index, hooks in NODE_HOOKS.pop(node, {}).items():
                if slot.get(index) is not None:
                    slot[index] = hooked(hooks, slot[index])
            if capture is not None:
                for index, grad in slot.items():
                    if (id(node), index) in capture:
                        captured[capture[(id(node), index)]] = grad
            if is_accumulate(node):
                variable, grad = node.variable, slot.get(0)
                if grad is not None:
                    grad = hooked(LEAF_HOOKS.get(variable, []), grad)
                    if capture is not None:
                        if id(variable) in capture:
                            captured[capture[id(variable)]] = grad
                    else:
                        with torch.no_grad():
                            if variable.grad is None:
                                variable.grad = grad.detach()
                            else:
                                variable.grad.add_(grad)
                        for hook in POST_HOOKS.get(variable, []):
                            hook(variable)
                outputs = ()
            else:
                metadata = node._input_metadata
                inputs = []
                for i, meta in enumerate(metadata):
                    g = slot.get(i)
                    if g is None:
                        g = torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device)
                    inputs.append(g)
                del slot
                UNPACKED.clear()
                # The engine runs each node with grad mode as `create_graph` asks (off by default):
                # with it on, a formula over a saved tensor that requires grad would record a graph
                # of the backward itself and keep every gradient alive.
                with torch.set_grad_enabled(create_graph):
                    outputs = python_function_outputs(node, node.apply(*inputs)) if hasattr(
                        node, "_forward_cls") else node(*inputs)
                del inputs
                if not retain_graph:
                    for saved in UNPACKED:
                        saved.tensor = None
                    if hasattr(node, "_forward_cls"):
                        node.maybe_clear_saved_tensors()
                UNPACKED.clear()
                if isinstance(outputs, torch.Tensor) or outputs is None:
                    outputs = (outputs,)
            for (child, index), grad in zip(node.next_functions, outputs):
                if child is None:
                    continue
                if grad is not None:
                    grad = validated(node, child, index, grad)
                    slot = buffers.setdefault(child, {})
                    slot[index] = grad if index not in slot else slot[index] + grad
                dependencies[child] -= 1
                if dependencies[child] == 0:
                    push(child)
            del outputs
    finally:
        RUN.in_backward = outer_task != -1
        RUN.graph_task = outer_task
    return captured


def python_function_outputs(node, outputs):
    """The gradients of a `torch.autograd.Function`'s backward, one per edge of its node: the
    backward returns one per argument of `forward`, and the node has an edge per tensor argument
    (none for the others), with no node where the tensor needs no gradient; the engine keeps the
    gradients of the arguments that need one, in order, for the edges that lead somewhere."""
    if not isinstance(outputs, tuple):
        outputs = (outputs,)
    edges = node.next_functions
    if len(outputs) == len(edges):
        return outputs
    wanted = iter([g for g, needed in zip(outputs, node.needs_input_grad) if needed])
    return tuple(next(wanted, None) if child is not None else None for child, _ in edges)


def validated(node, child, index, grad):
    """A gradient made fit for the input it flows to, as the engine's `validate_outputs` does: summed
    to the input's shape, cast to its dtype; on another device it is the engine's error."""
    meta = child._input_metadata[index] if not is_accumulate(child) else None
    if meta is None:
        variable = child.variable
        shape, dtype, device = variable.shape, variable.dtype, variable.device
    else:
        shape, dtype, device = meta.shape, meta.dtype, meta.device
    if tuple(grad.shape) != tuple(shape):
        grad = grad.sum_to_size(shape)
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    if grad.device != device:
        text = (f"invalid gradient - expected device {device} but got {grad.device} "
                f"(the gradient {type(node).__name__} passes to {type(child).__name__})")
        if RUN.mismatch is None:
            RUN.mismatch = {"operation": type(node).__name__, "devices": [str(grad.device), str(device)],
                            "shapes": [[list(grad.shape), str(grad.device)]], "module": MODULES.current(),
                            "location": user_frame(), "phase": "backward", "message": text}
        raise RuntimeError(text)
    return grad


class Removable:
    """The handle a hook registration returns."""

    def __init__(self, hooks, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self):
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def involves_fake(tensors):
    return any(isinstance(t, FakeTensor) for t in tensors)


def install_backward():
    real_backward = torch.autograd.backward
    real_tensor_backward = torch.Tensor.backward

    def as_list(x):
        if x is None:
            return None
        return [x] if isinstance(x, torch.Tensor) else list(x)

    def root_grads(roots, given):
        """The gradients the backward starts from, checked as torch.autograd's `_make_grads` and the
        engine check them: a root must require grad, and only a scalar's may be left implicit."""
        grads = as_list(given) or [None] * len(roots)
        for i, (root, grad) in enumerate(zip(roots, grads)):
            if not root.requires_grad:
                raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
            if grad is None and root.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
        return [g if g is not None else torch.ones_like(r) for r, g in zip(roots, grads)]

    def autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                          inputs=None):
        roots = as_list(tensors)
        if not involves_fake(roots):
            return real_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
        if inputs is not None:
            raise NotImplementedError("vramplan validate --script does not run backward(inputs=...) on fake GPUs")
        grads = root_grads(roots, grad_tensors if grad_tensors is not None else grad_variables)
        backward_graph(roots, grads, retain_graph=bool(retain_graph) or create_graph, create_graph=create_graph)

    def tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if not isinstance(self, FakeTensor):
            return real_tensor_backward(self, gradient, retain_graph, create_graph, inputs)
        return autograd_backward([self], [gradient] if gradient is not None else None, retain_graph, create_graph)

    def autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
                      only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
        roots, wanted = as_list(outputs), as_list(inputs)
        if not involves_fake(roots):
            return real_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs, allow_unused,
                             is_grads_batched, materialize_grads)
        if is_grads_batched:
            raise NotImplementedError("vramplan validate --script does not run batched gradients on fake GPUs")
        grads = root_grads(roots, grad_outputs)
        capture = {}
        for i, t in enumerate(wanted):
            capture[id(t) if t.grad_fn is None else (id(t.grad_fn), t.output_nr)] = i
        retain = create_graph if retain_graph is None else retain_graph
        found = backward_graph(roots, grads, retain_graph=bool(retain), create_graph=create_graph, capture=capture)
        result = []
        for i, t in enumerate(wanted):
            g = found.get(i)
            if g is None and materialize_grads:
                g = torch.zeros_like(t)
            if g is None and not (allow_unused or materialize_grads):
                raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                                   "Set allow_unused=True if this is the desired behavior.")
            result.append(g)
        return tuple(result)

    def register_hook(self, hook):
        if not isinstance(self, FakeTensor):
            return real_register_hook(self, hook)
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            hooks = LEAF_HOOKS.setdefault(self, [])
        else:
            hooks = NODE_HOOKS.setdefault(self.grad_fn, {}).setdefault(self.output_nr, [])
        hooks.append(hook)
        return Removable(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook):
        if not isinstance(self, FakeTensor):
            return real_post_hook(self, hook)
        hooks = POST_HOOKS.setdefault(self, [])
        hooks.append(hook)
        return Removable(hooks, hook)

    def retain_grad(self):
        if not isinstance(self, FakeTensor) or self.grad_fn is None:
            return real_retain_grad(self)
        tensor = weakref.ref(self)

        def keep(grad):
            t = tensor()
            if t is not None:
                t.grad = grad if t.grad is None else t.grad + grad
        register_hook(self, keep)

    real_grad = torch.autograd.grad
    real_register_hook = torch.Tensor.register_hook
    real_post_hook = torch.Tensor.register_post_accumulate_grad_hook
    real_retain_grad = torch.Tensor.retain_grad
    torch.autograd.grad = autograd_grad
    torch.Tensor.register_hook = register_hook
    torch.Tensor.register_post_accumulate_grad_hook = register_post_accumulate_grad_hook
    torch.Tensor.retain_grad = retain_grad
    # A module's full backward hooks sit on autograd nodes, which this engine does not read.
    backward_hook_init = torch.utils.hooks.BackwardHook.__init__

    def noted_backward_hook(self, *args, **kwargs):
        RUN.note("a module's backward hooks (register_full_backward_hook) do not run on fake GPUs")
        return backward_hook_init(self, *args, **kwargs)

    torch.utils.hooks.BackwardHook.__init__ = noted_backward_hook
    real_task_id = torch._C._current_graph_task_id
    torch._C._current_graph_task_id = lambda: RUN.graph_task if RUN.graph_task != -1 else real_task_id()
    torch.autograd.backward = autograd_backward
    torch.Tensor.backward = tensor_backward
    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


# --- attention kernels as CUDA picks them ------------------------------------------------------------

def install_attention():
    """`scaled_dot_product_attention` on fake CUDA tensors runs the kernel PyTorch's CUDA dispatch
    would pick (`sdp_utils.cpp`, in its priority order), since the fake mode alone decomposes it
    into the math path, which keeps the whole attention matrix for backward:
    - flash attention: compute capability 8.0 or later, fp16 or bf16, a head size that is a multiple
      of 8 up to 256, no mask, the same head size for query, key and value; grouped-query attention
      included. It keeps the output and the log-sum-exp.
    - memory-efficient attention: capability 5.0 or later (bf16 from 8.0), fp16, bf16 or fp32, a
      head size that is a multiple of 8 (4 in fp32), masks allowed, no grouped-query attention.
    - otherwise the math path, as the fake mode runs it.
    And transformers reads a position tensor's values to pass `is_causal` instead of a mask; a fake
    tensor has none, so it is told what a batch without padding gives (as vramplan's reference
    tracer, scripts/reference/trace.py, tells it)."""
    import torch.nn.functional as F

    math = F.scaled_dot_product_attention

    def backend(q, k, v, attn_mask, enable_gqa):
        cap = GPUS[index_of(q.device)]["capability"]
        head = q.shape[-1]
        same_heads = q.shape[-3] == k.shape[-3] if q.dim() >= 3 else True
        same_dims = head == k.shape[-1] == v.shape[-1]
        if (tuple(cap) >= (8, 0) and q.dtype in (torch.float16, torch.bfloat16) and head % 8 == 0
                and head <= 256 and attn_mask is None and same_dims and q.dim() == 4
                and (same_heads or enable_gqa)):
            return "flash"
        aligned = head % (4 if q.dtype == torch.float32 else 8) == 0
        dtypes = (torch.float16, torch.float32) + ((torch.bfloat16,) if tuple(cap) >= (8, 0) else ())
        if tuple(cap) >= (5, 0) and q.dtype in dtypes and aligned and same_heads and q.dim() == 4:
            return "efficient"
        return "math"

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not (isinstance(query, FakeTensor) and query.device.type == "cuda"):
            return math(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        kind = backend(query, key, value, attn_mask, enable_gqa)
        if kind == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if kind == "efficient":
            mask = attn_mask
            if mask is not None and mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                    mask.logical_not(), float("-inf"))
            if mask is not None:
                mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, grad, dropout_p, is_causal, scale=scale)[0]
        return math(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa
    torch._C._nn.scaled_dot_product_attention = sdpa
    try:
        import transformers.masking_utils as masking
    except Exception:  # noqa: BLE001
        return
    masking.is_tracing = lambda tensor=None: False
    masking.find_packed_sequence_indices = lambda position_ids: None


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
            MODULES.forwards += 1
            RUN.progress()
            if not RUN.optimizers and MODULES.forwards >= STEPS and not RUN.in_backward:
                raise StopRun()
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


# --- the run ----------------------------------------------------------------------------------------------

def versions():
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("transformers", "accelerate", "peft", "bitsandbytes"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "")
    return out


REAL = bool(REQUEST.get("real"))


def real_outcome(error):
    """On real GPUs (`real` in the request, for checking the fake run): the mismatch or the
    out-of-memory PyTorch raised, read from its message."""
    import re

    text = str(error)
    found = re.search(r"found at least two devices, ([\w:]+) and ([\w:]+)", text)
    if found and RUN.mismatch is None:
        RUN.mismatch = {"operation": "", "devices": list(found.groups()), "shapes": [], "module": MODULES.current(),
                        "location": traceback_user_frame(error.__traceback__), "phase": "", "message": text[:500]}
        return True
    if isinstance(error, torch.OutOfMemoryError) and RUN.oom is None:
        device = re.search(r"GPU (\d+)", text)
        RUN.oom = {"device": int(device.group(1)) if device else 0, "module": MODULES.current(),
                   "location": traceback_user_frame(error.__traceback__), "allocated_bytes": 0,
                   "usable_bytes": 0, "requested_bytes": 0}
        return True
    return False


def main():
    if REAL:
        if torch.cuda.device_count() != len(GPUS):
            fail("no_device", f"the profile has {len(GPUS)} GPUs and this machine {torch.cuda.device_count()}",
                 needed=len(GPUS), found=torch.cuda.device_count())
        torch.cuda.init()
        for i in range(len(GPUS)):
            torch.cuda.reset_peak_memory_stats(i)
    else:
        install_fake_cuda()
        make_fake_mode()
        install_fake_cuda()  # again: run_plan's fake mode takes every GPU for an H100
        install_value_reads()
        install_attention()
        install_backward()
        install_fake_process_group()
        install_threads()
        install_current_device()
        install_savers()
    install_step_counting()
    install_weightless_loading()
    outcome, message, location, error_module = "completed", "", None, ""
    sys.argv = [SCRIPT] + list(REQUEST.get("args") or [])
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        with contextlib.nullcontext() if REAL else ROUTER:
            runpy.run_path(SCRIPT, run_name="__main__")
    except StopRun:
        pass
    except SystemExit as e:
        if e.code not in (None, 0):
            outcome, message = "error", f"the script exited with {e.code}"
    except BaseException as e:  # noqa: BLE001
        outcome = "error"
        if REAL:
            real_outcome(e)
        message = "".join(traceback.format_exception_only(type(e), e)).strip()
        if os.environ.get("VRAMPLAN_HARNESS_DEBUG"):
            traceback.print_exc()
        location = traceback_user_frame(e.__traceback__)
        error_module = MODULES.current()
    if RUN.mismatch is not None:
        outcome = "device_mismatch"
    elif RUN.oom is not None and outcome != "completed":
        outcome = "out_of_memory"
    elif RUN.oom is not None:
        where = RUN.oom["location"]
        place = f"{where['file']}:{where['line']}" if where else "the script"
        RUN.note(f"{place}: {RUN.ooms} allocation{'s' if RUN.ooms != 1 else ''} ran out of memory on GPU "
                 f"{RUN.oom['device']}; the script caught the error and went on")
    elif outcome == "completed" and GPUS and (
            RUN.cuda_ops == 0 if not REAL else all(torch.cuda.max_memory_allocated(i) == 0 for i in range(len(GPUS)))):
        outcome = "gpu_idle"
    per_device = []
    for i, gpu in enumerate(GPUS):
        entry = {"device": i, "peak_allocated_bytes": MEMORY.peak[i], "peak_at": MEMORY.peak_at[i],
                 "peak_module": MEMORY.peak_module[i], "usable_bytes": gpu["usable_bytes"]}
        if REAL:
            entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(i)
            entry["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(i)
        per_device.append(entry)
    result = {
        "outcome": outcome, "message": message[:2000], "location": location, "module": error_module,
        "mismatch": RUN.mismatch, "oom": RUN.oom, "steps": RUN.steps, "forwards": MODULES.forwards,
        "optimizers": RUN.optimizers, "cuda_ops": RUN.cuda_ops, "cpu_ops": RUN.cpu_ops,
        "per_device": per_device, "peak_total_bytes": MEMORY.peak_total, "events": MEMORY.events,
        "phases": RUN.phase_marks, "activations": RUN.activations, "notes": RUN.notes, "versions": versions(),
        "seconds": round(time.monotonic() - RUN.started, 3),
    }
    with open(REQUEST["result"], "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
