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
(``broadcast_buffers=True``). ``sync_buffers_at_forward`` gives the unwrapped module the same
rule, one step tighter: on N processes rank 0's parameters and buffers are copied to every
process at ``prepare``, and rank 0's buffers after each forward run with gradients enabled (one
broadcast per dtype, flattened), through a forward hook. After, not before: DDP's copy before
the forward leaves each process's last update in place, so a model evaluated after the last
training step would still differ between processes; copied after, every process evaluates rank
0's model, as every process of a DDP job that saves and reloads rank 0's checkpoint would. A
forward under ``torch.no_grad()`` (evaluation) is left alone, as DDP leaves it; on one process
nothing happens. The module stays the user's own object; the hook is a picklable object, so
``torch.save(model)`` and ``copy.deepcopy`` keep working, and in a process with no process group
it does nothing.

As with DDP, every process must run the module's grad-enabled forwards the same number of times
(a module run only on the main process with gradients enabled would wait for the others).
"""

from __future__ import annotations

from typing import Any

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


class BroadcastBuffers:
    """Forward hook: copy rank 0's buffers to every process after a grad-enabled forward."""

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled() and _in_a_group():
            _broadcast_from_rank0(list(module.buffers()))


def sync_buffers_at_forward(model: nn.Module) -> nn.Module:
    """Copy rank 0's parameters and buffers to every process now, and register
    ``BroadcastBuffers`` on ``model`` (once, when it holds buffers); returns ``model``."""
    if _in_a_group():
        _broadcast_from_rank0([*model.parameters(), *model.buffers()])
    if next(model.buffers(), None) is None:
        return model
    if any(isinstance(hook, BroadcastBuffers) for hook in model._forward_hooks.values()):
        return model
    model.register_forward_hook(BroadcastBuffers())
    return model
