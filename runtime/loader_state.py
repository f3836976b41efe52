"""Where a prepared loader stands: epoch, position, and the RNG states an epoch started from
(saved by ``save_state`` so a mid-epoch checkpoint resumes at the next batch)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler

from .checkpoint import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from .device_loader import _DeviceIterator


@dataclass
class LoaderProgress:
    """Where a prepared loader stands in its epochs (shared with its skip_first_batches views)."""

    next_epoch: int = 0
    epoch: int = 0  # the epoch of the latest iteration
    current: weakref.ref[_DeviceIterator] | None = None  # that iteration, while it is alive
    epoch_start: dict[str, Any] | None = None  # the RNG states that iteration started from
    resume: dict[str, Any] | None = None  # a mid-epoch position restored by load_state_dict


def find_generators(loader: DataLoader) -> list[torch.Generator]:
    """The ``torch.Generator`` objects that decide a loader's order (loader, samplers), in order."""
    found: list[torch.Generator] = []
    seen: set[int] = set()
    pending: list[tuple[Any, int]] = [(loader, 0)]
    while pending:
        obj, depth = pending.pop(0)
        if obj is None or id(obj) in seen or depth > 4:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            found.append(obj)
            continue
        for name in ("generator", "batch_sampler", "sampler", "source"):
            child = getattr(obj, name, None)
            if isinstance(child, (torch.Generator, Sampler, BatchSampler)) or (
                child is not None and name != "generator" and hasattr(child, "__iter__")
            ):
                pending.append((child, depth + 1))
    return found


def rng_snapshot(generators: list[torch.Generator]) -> dict[str, Any]:
    """This process's python/numpy/torch RNG states plus the given generators' states."""
    return {
        "rng": capture_rng_state(include_cuda=False),
        "generators": [generator.get_state() for generator in generators],
    }


def restore_rng_snapshot(snapshot: dict[str, Any], generators: list[torch.Generator]) -> None:
    """Set the states ``rng_snapshot`` captured."""
    restore_rng_state(snapshot["rng"])
    for generator, state in zip(generators, snapshot["generators"]):
        generator.set_state(state)
