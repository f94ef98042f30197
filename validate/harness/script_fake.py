"""Fake CUDA devices for the script harness: `torch.cuda` answering as the profile's GPUs, the
fake mode, the dispatch mode (`Router`) that sends every operation touching a GPU tensor through
it (checking PyTorch's device rule and tracking memory), the values a fake tensor is read as, and
the attention kernel CUDA's dispatch would pick."""

import sys
import time

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from script_state import GPUS, HARNESS_DIR, MEMORY, MODULES, RUN, user_frame
from script_workspace import charge as blas_workspaces

# --- fake CUDA ------------------------------------------------------------------------------------

CURRENT = {"device": 0}
FAKE = None


def make_fake_mode():
    """The fake mode, made once `torch.cuda` answers as the profile (run_plan imports transformers and
    accelerate, which read `torch.cuda.is_available()` once)."""
    global FAKE
    sys.path.insert(0, HARNESS_DIR)
    from run_plan import fake_devices

    FAKE = fake_devices(capability=None)
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
NONZERO = torch.ops.aten.nonzero.default
INDEX = torch.ops.aten.index.Tensor
MASKED_SELECT = torch.ops.aten.masked_select.default


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
        except DynamicOutputShapeException:
            out = self.selected_all(func, args, kwargs)
            if out is None:
                raise
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
        blas_workspaces(func, args, kwargs, outs)
        return out

    def selected_all(self, func, args, kwargs):
        """An operation whose output's size depends on values (`nonzero`, indexing by a boolean
        mask, `masked_select`), taken with every element selected: the largest output, so the most
        memory. None for another operation. Noted once per place."""
        where = user_frame()
        place = f"{where['file']}:{where['line']}" if where else "the script"
        note = (f"{place}: {func.overloadpacket.__name__} selects by values a fake run does not have; "
                f"every element was taken as selected (the most memory)")
        if func is NONZERO:
            x = args[0]
            RUN.note(note)
            with FAKE:
                return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        if func is INDEX and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            # As ATen's `expandTensors`: a k-dimensional mask becomes k index tensors (its nonzero).
            indices = []
            for i in args[1]:
                if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                    with FAKE:
                        indices.extend(torch.empty(i.numel(), dtype=torch.long, device=i.device) for _ in range(i.dim()))
                else:
                    indices.append(i)
            RUN.note(note)
            with FAKE:
                return func(args[0], indices)
        if func is MASKED_SELECT:
            x, mask = args[0], args[1]
            RUN.note(note)
            with FAKE:
                return torch.empty(torch.broadcast_shapes(x.shape, mask.shape).numel(), dtype=x.dtype, device=x.device)
        return None

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
