"""vramplan's script harness: runs a user's unmodified training or inference script on fake CUDA
devices and writes what happened as one JSON document (`vramplan validate --script`).

The harness is five files, written beside each other to a temporary folder: this one (the run),
`script_state.py` (the request, the run's state, each fake GPU's memory), `script_fake.py` (fake
CUDA, the dispatch mode, attention kernels), `script_backward.py` (backward without autograd's
engine) and `script_runtime.py` (steps, `from_pretrained`, savers, distributed); `run_plan.py`
gives them the fake mode.

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
import time
import traceback

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HARNESS_DIR)

try:
    import torch  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(json.dumps({"outcome": "missing_library", "message": f"{type(e).__name__}: {e}"}))
    sys.exit(3)

import script_backward  # noqa: E402
import script_fake  # noqa: E402
import script_runtime  # noqa: E402
from script_state import (GPUS, MEMORY, MODULES, REQUEST, RUN, SCRIPT, StopRun, fail,  # noqa: E402
                          traceback_user_frame)

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
        script_fake.install_fake_cuda()
        script_fake.make_fake_mode()
        script_fake.install_value_reads()
        script_fake.install_attention()
        script_backward.install_backward()
        script_runtime.install_fake_process_group()
        script_runtime.install_threads()
        script_runtime.install_current_device()
        script_runtime.install_savers()
        script_runtime.install_triton()
    script_runtime.install_step_counting()
    script_runtime.install_weightless_loading()
    outcome, message, location, error_module = "completed", "", None, ""
    sys.argv = [SCRIPT] + list(REQUEST.get("args") or [])
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        with contextlib.nullcontext() if REAL else script_fake.ROUTER:
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
        "per_device": per_device, "peak_total_bytes": MEMORY.peak_total,
        "peak_total_workspace_bytes": MEMORY.peak_total_workspaces, "events": MEMORY.events,
        "phases": RUN.phase_marks, "activations": RUN.activations, "notes": RUN.notes, "versions": versions(),
        "seconds": round(time.monotonic() - RUN.started, 3),
    }
    with open(REQUEST["result"], "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
