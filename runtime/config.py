"""Configuration objects with HF Accelerate's names (``accelerate.utils``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from .state import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class InitProcessGroupKwargs:
    """Arguments for ``init_process_group``: the backend (None: automatic) and collective timeout."""

    backend: str | None = None
    timeout: timedelta = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class DistributedDataParallelKwargs:
    """Keyword arguments forwarded to ``DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields that differ from DDP's defaults."""
        defaults = asdict(DistributedDataParallelKwargs())
        return {k: v for k, v in asdict(self).items() if v != defaults[k]}


@dataclass(frozen=True)
class DataLoaderConfiguration:
    """How prepared loaders shard data (the subset of Accelerate's options implemented so far)."""

    split_batches: bool = False
    even_batches: bool = True
