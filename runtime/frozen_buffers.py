"""Buffers of a prepared module that has nothing to train stay the same on every process.

A module with no trainable parameter (a frozen encoder, a teacher, a metric network) is not
wrapped in DistributedDataParallel: DDP refuses it, and there is no gradient to average. Accelerate
returns such a module as it is. But its buffers may still change in a forward pass: a frozen
ResNet in ``train()`` mode updates its BatchNorm running statistics from each process's own
batches, so after a few steps every process holds different statistics, evaluates a different
model and (from an unprepared validation loader) computes a different metric. A learning-rate
decay or an early stop decided on that metric then differs between processes: they drift apart,
or one stops while the others wait in the next collective.

DDP keeps the modules it wraps alike: it broadcasts rank 0's parameters and buffers when it is
built, and rank 0's buffers before each forward pass run with gradients enabled
(``broadcast_buffers=True``). ``keep_in_step_with_rank0`` gives the unwrapped module the same rule,
one step tighter: on N processes rank 0's parameters and buffers are copied to every process at
``prepare``, and ``sync_frozen_buffers`` copies rank 0's buffers of every such module after each
``accelerator.backward`` (one broadcast per dtype, flattened, in the order the modules were
prepared, which is every process's). After the step, not before the next forward: DDP's copy
before the forward leaves each process's last update in place, so a model evaluated after the
last training step would still differ between processes; copied after, every process evaluates
rank 0's module, as every process of a DDP job that saves and reloads rank 0's checkpoint would.
On one process nothing happens.

Nothing is added to the module: no hook, no attribute (the runtime holds weak references), so
the module stays the user's own object, and ``torch.save(module)`` / pickling write exactly what
the user's script wrote, loadable where this runtime is not installed.

Every process calls ``accelerator.backward`` the same number of times (DDP needs it too), so the
broadcasts pair up. Buffers that change outside a training step (a forward under
``torch.no_grad()`` in ``train()`` mode, run on one process only) are left to that process, as
DDP leaves them.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def _in_a_group() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _broadcast_from_rank0(tensors: list[torch.Tensor]) -> None:
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        by_kind.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for group in by_kind.values():
        flat = _flatten_dense_tensors([t.detach() for t in group])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for tensor, synced in zip(group, _unflatten_dense_tensors(flat, group)):
                tensor.copy_(synced)


_FROZEN: list[weakref.ref[nn.Module]] = []  # prepared modules with nothing to train, in prepare order


def sync_frozen_buffers() -> None:
    """Copy rank 0's buffers of every tracked module to every process (after a backward)."""
    if not _FROZEN or not _in_a_group():
        return
    modules = [module for ref in _FROZEN if (module := ref()) is not None]
    buffers = [buffer for module in modules for buffer in module.buffers()]
    if buffers:
        _broadcast_from_rank0(buffers)


def keep_in_step_with_rank0(model: nn.Module) -> nn.Module:
    """Copy rank 0's parameters and buffers to every process now, and track ``model`` (once, when
    it holds buffers) for ``sync_frozen_buffers``; returns ``model`` itself."""
    if not _in_a_group():
        return model
    _broadcast_from_rank0([*model.parameters(), *model.buffers()])
    if next(model.buffers(), None) is not None and not any(ref() is model for ref in _FROZEN):
        _FROZEN.append(weakref.ref(model))
    return model
