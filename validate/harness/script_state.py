"""The script harness's shared state: the request, where the user's code is, the modules running,
the run's counters and findings, and the memory of every fake GPU (`run_script.py` says how the
run is faked; each `script_*.py` module reads and changes this state)."""

import functools
import json
import os
import sys
import sysconfig
import time
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))


def fail(outcome, message, code=3, **fields):
    """Refuses to run: one JSON line on stdout (vramplan reads it), and exit `code`."""
    print(json.dumps({"outcome": outcome, "message": message, **fields}))
    sys.exit(code)

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

@functools.lru_cache(maxsize=None)
def is_user_file(filename):
    """Whether `filename` is the user's code (not the standard library, an installed package, torch
    or this harness). Cached: it is asked for every frame at every new memory peak."""
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
            self.forward_done()

    def forward_done(self):
        """One forward pass of the script ended: a script with no optimizer stops after `STEPS`."""
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
        self.workspaces = 0    # of `total`, the BLAS workspaces (`script_workspace.py`)
        self.peak_total_workspaces = 0   # of `peak_total`, the BLAS workspaces then

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
        ident = self.allocate(device, size, creator=True)
        self.seen[storage] = ident
        weakref.finalize(storage, self.freed, device, ident, size)

    def allocate(self, device, size, creator=False, workspace=False):
        """Counts `size` bytes (a multiple of 512) allocated on `device` and returns the
        allocation's id, or raises PyTorch's out-of-memory error where they do not fit (the
        allocation then never exists). `creator`: a tensor's storage, which the activation
        measurement attributes to the module running; `workspace`: a BLAS library's workspace."""
        ident = self.next_id
        self.next_id += 1
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
        if creator and self.creators is not None:
            path = MODULES.current_path()
            if path is not None:
                self.creators[ident] = (path, size)
        self.live[device] += size
        self.total += size
        self.workspaces += size if workspace else 0
        if self.total > self.peak_total:
            self.peak_total = self.total
            self.peak_total_workspaces = self.workspaces
        self.events.append([device, ident, size])
        if self.live[device] > self.peak[device]:
            self.peak[device] = self.live[device]
            self.peak_at[device] = user_frame()
            self.peak_module[device] = MODULES.current()
        return ident

    def freed(self, device, ident, size, workspace=False):
        if self.creators is not None:
            self.creators.pop(ident, None)
        self.live[device] -= size
        self.total -= size
        self.workspaces -= size if workspace else 0
        self.events.append([device, ident, 0])


MEMORY = Memory(len(GPUS))
