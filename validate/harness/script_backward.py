"""Backward without autograd's engine, for the script harness: PyTorch's engine cannot run over
fake CUDA tensors in a process without a GPU, so the recorded graph is run here node by node, in
the engine's order, with its checks, hooks and `torch.autograd.grad` (run_script.py says why and
how)."""

import os
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.weak import WeakIdKeyDictionary

from script_state import MODULES, RUN, user_frame

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
