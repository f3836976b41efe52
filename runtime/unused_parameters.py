"""Parameters that require grad but never get a gradient: left out of DDP's synchronisation.

A script that trains on one process may run part of its model under ``torch.no_grad()`` or on
detached tensors while the parameters there still require grad: a pretrained encoder used as a
frozen feature extractor whose parameters were never given ``requires_grad=False``, an embedding
detached by a ``fix_emb`` flag. On one process they simply get no gradient and the optimizer skips
them. Plain ``DistributedDataParallel`` (``find_unused_parameters=False``) waits for every
parameter it registered: the bucket holding such a parameter is never all-reduced, the gradients
that share it stay local to each process, and the next forward fails ("Expected to have finished
reduction in the prior iteration").

DDP users fix it in one of three ways: freeze the parameters before wrapping
(``p.requires_grad_(False)``), ``find_unused_parameters=True`` (a walk of the autograd graph in
every step, for parameters that are used in some steps only), or ``static_graph=True``. The
runtime does the first by itself where that is safe, on the first synchronising backward of each
prepared DDP model (``Accelerator.backward`` checks it once anyway, runtime/accelerator.py):

* the trainable parameters left without a gradient must be the same on every process (one
  all-gather of a mask); otherwise ``GradientSyncError`` advises ``find_unused_parameters=True``;
* this step's gradients, left local by DDP, are averaged across the processes (as DDP would:
  divided by the number of processes, then summed), so the first step is synchronised too;
* the parameters are added to DDP's ``parameters_to_ignore`` and its reducer is rebuilt without
  them (what unpickling a DDP model does), so every later step is plain DDP over the parameters
  that train: no per-step cost, unlike ``find_unused_parameters=True``;
* the main process gets one ``RuntimeWarning`` naming them and the explicit options;
* each left-out parameter gets a post-accumulate-grad hook: if it ever receives a gradient
  (the part was unfrozen later, or it is used only in some steps) backward raises
  ``GradientSyncError`` instead of letting that gradient stay local and the replicas drift.

Not done (the first backward's ``GradientSyncError`` stays, with its advice): when the model was
wrapped with ``find_unused_parameters=True`` or ``static_graph=True`` (DDP handles it itself),
with ``gradient_as_bucket_view=True`` (the gradients are DDP's buckets, partly reduced already),
with sparse gradients, or when no parameter that got a gradient would be left.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .errors import GradientSyncError

# The hooks left-out parameters carry, so that preparing the module again removes them.
_hooks: "weakref.WeakKeyDictionary[nn.Parameter, Any]" = weakref.WeakKeyDictionary()


class ExcludedParameterGotGradient:
    """Post-accumulate-grad hook of a parameter left out of DDP's synchronisation."""

    def __init__(self, name: str, owner: str) -> None:
        self.name = name
        self.owner = owner

    def __call__(self, param: torch.Tensor) -> None:
        raise GradientSyncError(
            f"{self.owner}.{self.name} received a gradient, but it got none in the first training "
            "step, so the runtime left it out of DDP's gradient synchronisation: its gradient "
            "would stay local to each process.",
            "a parameter that gets no gradient in the first step never gets one (a part run "
            "under torch.no_grad() or detached).",
            "if the parameter is used only in some steps or unfrozen later, create the "
            "Accelerator with kwargs_handlers=[DistributedDataParallelKwargs("
            "find_unused_parameters=True)]; if it should not train, set requires_grad_(False) "
            "on it before accelerator.prepare.",
        )


def release(module: nn.Module) -> None:
    """Remove the hooks an earlier exclusion put on ``module``'s parameters (prepared again)."""
    for param in module.parameters():
        handle = _hooks.pop(param, None)
        if handle is not None:
            handle.remove()


def can_exclude(model: DistributedDataParallel) -> bool:
    """Whether the runtime may leave this model's gradient-less parameters out by itself."""
    return not (model.find_unused_parameters or model.static_graph or model.gradient_as_bucket_view
                or not hasattr(model, "_ddp_init_helper"))


def silent_mask(model: DistributedDataParallel) -> tuple[list[str], torch.Tensor]:
    """The synchronised parameters' names, and 1.0 where the last backward gave no gradient."""
    ignored = model.parameters_to_ignore
    names, mask = [], []
    for name, param in model.module.named_parameters():
        if param.requires_grad and name not in ignored:
            names.append(name)
            mask.append(1.0 if param.grad is None else 0.0)
    return names, torch.tensor(mask, dtype=torch.float32)


def exclude(model: DistributedDataParallel, silent: list[str], is_main_process: bool) -> bool:
    """Average this step's gradients, leave ``silent`` out of DDP's reducer, hook and warn.

    Every process calls it with the same ``silent`` names (checked by the caller). Returns False,
    having changed nothing, where the runtime cannot do it safely (see the module docstring).
    """
    module = model.module
    params = dict(module.named_parameters())
    silent_params = {id(params[name]) for name in silent}
    trained = [p for name, p in params.items()
               if p.requires_grad and id(p) not in silent_params and name not in model.parameters_to_ignore]
    grads = [p.grad for p in trained if p.grad is not None]
    if not grads or any(g.is_sparse for g in grads):
        return False
    # This step: DDP left these gradients local. Average them as DDP does (divide, then sum).
    group = model.process_group
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(dist.get_world_size(group))
    dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    # Later steps: a reducer without them (the names DDP's _build_params_for_reducer compares).
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            if id(param) in silent_params:
                model.parameters_to_ignore.add(f"{module_name}.{param_name}")
                model.parameters_to_ignore.add(f"{module_name}.{param_name}".lstrip("."))
    model._module_parameters = [p for n, p in module.named_parameters() if n not in model.parameters_to_ignore]
    parameters, expect_sparse = model._build_params_for_reducer()
    mapping = model._build_debug_param_to_name_mapping(parameters)
    model._ddp_init_helper(parameters, expect_sparse, mapping, model.static_graph)
    owner = type(module).__name__
    for name in silent:
        param = params[name]
        if param not in _hooks:
            _hooks[param] = param.register_post_accumulate_grad_hook(
                ExcludedParameterGotGradient(name, owner))
    if is_main_process:
        shown = ", ".join(silent[:6]) + (f" and {len(silent) - 6} more" if len(silent) > 6 else "")
        warnings.warn(
            f"{len(silent)} trainable parameters of the prepared {owner} got no gradient in the "
            f"first training step on every process ({shown}): they are run under "
            "torch.no_grad(), detached or left out of the loss while requires_grad is True. "
            "The runtime leaves them "
            "out of gradient synchronisation (as freezing them would; plain DDP would stop at the "
            "next step). To say so yourself, call requires_grad_(False) on them before "
            "accelerator.prepare; if some of them train in later steps, pass "
            "kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)] "
            "(backward raises GradientSyncError if one of them gets a gradient).",
            RuntimeWarning,
            stacklevel=4,
        )
    return True
