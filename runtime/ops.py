"""Collective helpers (gather, seed broadcast, barrier) and nested-structure mapping.

Every helper is a no-op on one process. None of them is called per step by the runtime itself:
the only collective the data path issues is one seed broadcast per shuffled epoch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
import torch.distributed as dist

from .state import ProcessState

T = TypeVar("T")


def apply_to_tensors(obj: T, fn: Callable[[torch.Tensor], torch.Tensor]) -> T:
    """Return ``obj`` with ``fn`` applied to every tensor inside it, keeping container types.

    Handles lists, tuples, namedtuples, mappings and dataclass instances; anything else is
    returned unchanged.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)  # type: ignore[return-value]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(apply_to_tensors(item, fn) for item in obj))  # type: ignore[return-value]
    if isinstance(obj, (list, tuple)):
        return type(obj)(apply_to_tensors(item, fn) for item in obj)  # type: ignore[return-value]
    if isinstance(obj, Mapping):
        items = {key: apply_to_tensors(value, fn) for key, value in obj.items()}
        try:
            return type(obj)(items)  # type: ignore[call-arg,return-value]
        except TypeError:  # mappings whose constructor takes other arguments (defaultdict, ...)
            return items  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            # object.__setattr__ also works for frozen dataclasses.
            object.__setattr__(new, field.name, apply_to_tensors(getattr(obj, field.name), fn))
        return new
    return obj


def gather(obj: T, state: ProcessState) -> T:
    """Concatenate every rank's tensors along dim 0 (0-d tensors become 1-d), in rank order.

    Shapes must match across ranks except that all must have the same size (pad first otherwise).
    """
    if not state.distributed:
        return obj

    def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 0:
            tensor = tensor[None]
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(state.world_size)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=0)

    return apply_to_tensors(obj, _gather_one)


def broadcast_int(value: int, state: ProcessState, src: int = 0) -> int:
    """Return rank ``src``'s ``value`` on every rank (one collective)."""
    if not state.distributed:
        return value
    # nccl only moves CUDA tensors, gloo moves CPU tensors: the state's device fits the backend.
    tensor = torch.tensor([value], dtype=torch.int64, device=state.device)
    dist.broadcast(tensor, src=src)
    return int(tensor.item())


def barrier(state: ProcessState) -> None:
    """Block until every rank arrives here (no-op on one process)."""
    if state.distributed:
        if state.backend == "nccl":
            dist.barrier(device_ids=[state.device.index])
        else:
            dist.barrier()
