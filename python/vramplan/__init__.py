"""vramplan: plan GPU memory before you launch.

Where the memory of a training or inference step goes, where each layer and expert should go
(an exact ILP with HiGHS; accelerate's `device_map="auto"` beside it), what fits if the batch,
the sequence, the precision or the hardware change, and a validator that runs the plan or your
own script on fake GPUs. The same library as the `vramplan` command, keyword for flag::

    import vramplan
    plan = vramplan.plan("pythia-1b", hardware="t4x2", mode="train", lora_rank=16,
                         grad_ckpt=True, batch=2, seq=2048)
    plan.fits, plan.device_map       # True, {"gpt_neox.embed_in": 0, ...}

`model` is a built-in name, a path, a Hugging Face Hub id, a config dict, a
`transformers.PretrainedConfig` or a `torch.nn.Module`. Bad input raises `BadInput` (with the
file, the key and the fix); a plan that does not fit is a result whose `.fits` is False.
"""

from ._api import check, estimate, inspect, plan, plot, profiles, run, validate, validate_script, whatif
from ._errors import BadInput, InternalError, VramplanError
from ._results import Check, Estimate, Inspection, Plan, Result, Svg, Validation, WhatIf
from ._vramplan import __version__

__all__ = [
    "plan",
    "estimate",
    "check",
    "whatif",
    "validate",
    "validate_script",
    "inspect",
    "plot",
    "profiles",
    "run",
    "BadInput",
    "InternalError",
    "VramplanError",
    "Result",
    "Plan",
    "Estimate",
    "Check",
    "WhatIf",
    "Validation",
    "Inspection",
    "Svg",
    "__version__",
]
