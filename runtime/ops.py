"""Collective helpers (gather, reduce, pad, seed broadcast) and nested-structure mapping.

Every helper is a no-op on one process (``reduce`` returns a copy there,
``pad_across_processes`` its input). None of them is called per step by the runtime itself: the only
collective the data path issues is one seed (or generator state) broadcast per shuffled epoch.
Everything is a thin layer over ``torch.distributed`` (``all_gather``, ``all_reduce``,
``all_gather_object``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .errors import AccelError
from .state import ProcessState

T = TypeVar("T")


def apply_to_tensors(
    obj: T, fn: Callable[[torch.Tensor], torch.Tensor], other: Callable[[Any], Any] | None = None
) -> T:
    """Return ``obj`` with ``fn`` applied to every tensor inside it, keeping container types.

    Handles lists, tuples, namedtuples, mappings and dataclass instances; anything else is
    returned unchanged, or passed to ``other`` when given.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)  # type: ignore[return-value]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(apply_to_tensors(item, fn, other) for item in obj))  # type: ignore[return-value]
    if isinstance(obj, (list, tuple)):
        return type(obj)(apply_to_tensors(item, fn, other) for item in obj)  # type: ignore[return-value]
    if isinstance(obj, Mapping):
        items = {key: apply_to_tensors(value, fn, other) for key, value in obj.items()}
        try:
            return type(obj)(items)  # type: ignore[call-arg,return-value]
        except TypeError:  # mappings whose constructor takes other arguments (defaultdict, ...)
            return items  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            # object.__setattr__ also works for frozen dataclasses.
            object.__setattr__(new, field.name, apply_to_tensors(getattr(obj, field.name), fn, other))
        return new
    return other(obj) if other is not None else obj


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


def broadcast_generator(generator: torch.Generator, state: ProcessState, src: int = 0) -> None:
    """Give ``generator`` rank ``src``'s state on every rank (one collective)."""
    if not state.distributed:
        return
    rng_state = generator.get_state().to(state.device)
    dist.broadcast(rng_state, src=src)
    generator.set_state(rng_state.cpu())


def is_tensor_tree(obj: Any) -> bool:
    """True when ``obj`` is a tensor or a (nested) container whose leaves are all tensors."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return len(obj) > 0 and all(is_tensor_tree(item) for item in obj)
    if isinstance(obj, Mapping):
        return len(obj) > 0 and all(is_tensor_tree(value) for value in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return all(is_tensor_tree(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return False


def gather_object(obj: Any, state: ProcessState) -> list[Any]:
    """Gather any picklable object from every rank (``all_gather_object``), in rank order.

    A list or tuple is concatenated across ranks (``[*rank0, *rank1, ...]``, Accelerate's
    ``gather_object``); any other object gives the list ``[rank0_obj, rank1_obj, ...]``. On one
    process: ``list(obj)`` for a list/tuple, else ``[obj]``.
    """
    sequence = isinstance(obj, (list, tuple))
    if not state.distributed:
        return list(obj) if sequence else [obj]
    parts: list[Any] = [None] * state.world_size
    dist.all_gather_object(parts, obj)
    if sequence:
        return [item for part in parts for item in part]
    return parts


def gather_uneven(obj: T, state: ProcessState) -> T:
    """``gather`` for tensors whose dim 0 differs across ranks (e.g. ``even_batches=False``).

    Pads every tensor to the largest dim 0 (one extra small ``all_gather`` of sizes), gathers,
    then drops the padding, so the result holds exactly the ranks' rows in rank order.
    """
    if not state.distributed:
        return obj

    def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 0:
            tensor = tensor[None]
        sizes = _all_sizes(tensor, 0, state)
        padded = _pad_to(tensor, 0, max(sizes), 0, False).contiguous()
        parts = [torch.empty_like(padded) for _ in range(state.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)], dim=0)

    return apply_to_tensors(obj, _gather_one)


REDUCTIONS = ("sum", "mean", "none")


def reduce(obj: T, state: ProcessState, reduction: str = "mean", scale: float = 1.0) -> T:
    """All-reduce every tensor in ``obj`` across ranks; the input is not modified.

    ``reduction="sum"`` adds the ranks' tensors, ``"mean"`` divides the sum by the number of
    processes (integer tensors give a floating-point mean), ``"none"`` returns a copy. The result
    is multiplied by ``scale``. On one process the sum and the mean are the tensor itself.
    """
    if reduction not in REDUCTIONS:
        raise AccelError(
            f"reduce() got reduction={reduction!r}.",
            f"one of {', '.join(repr(r) for r in REDUCTIONS)}.",
            'use reduction="sum" or reduction="mean".',
        )

    def _reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        if state.distributed and reduction != "none":
            dist.all_reduce(result, op=dist.ReduceOp.SUM)
        if reduction == "mean" and state.distributed:
            result = result / state.world_size
        if scale != 1.0:
            result = result * scale
        return result

    return apply_to_tensors(obj, _reduce_one)


def _all_sizes(tensor: torch.Tensor, dim: int, state: ProcessState) -> list[int]:
    """Every rank's ``tensor.shape[dim]`` (one small all_gather)."""
    size = torch.tensor([tensor.shape[dim]], dtype=torch.int64, device=tensor.device)
    sizes = [torch.empty_like(size) for _ in range(state.world_size)]
    dist.all_gather(sizes, size)
    return [int(s.item()) for s in sizes]


def _pad_to(
    tensor: torch.Tensor, dim: int, length: int, pad_index: Any, pad_first: bool
) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    filler = tensor.new_full(shape, pad_index)
    return torch.cat([filler, tensor] if pad_first else [tensor, filler], dim=dim)


def pad_across_processes(
    obj: T, state: ProcessState, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> T:
    """Pad every tensor in ``obj`` along ``dim`` to the largest size any rank has there.

    Padding uses ``pad_index`` and goes after the data (before it with ``pad_first=True``), so
    the results can be ``gather``-ed. 0-d tensors and tensors with fewer than ``dim + 1``
    dimensions are returned unchanged, as in Accelerate. One ``all_gather`` of sizes per tensor.
    """
    if not state.distributed:
        return obj

    def _pad_one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 0 or dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        return _pad_to(tensor, axis, max(_all_sizes(tensor, axis, state)), pad_index, pad_first)

    return apply_to_tensors(obj, _pad_one)


def broadcast_object(obj: Any, state: ProcessState, src: int = 0) -> Any:
    """Return rank ``src``'s picklable ``obj`` on every rank (one object broadcast)."""
    if not state.distributed:
        return obj
    holder = [obj]
    device = state.device if state.device.type == "cuda" else None  # nccl needs the device
    dist.broadcast_object_list(holder, src=src, device=device)
    return holder[0]
