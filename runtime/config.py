"""Configuration objects with HF Accelerate's names (``accelerate.utils``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any



@dataclass(frozen=True)
class InitProcessGroupKwargs:
    """Arguments for ``init_process_group``: the backend (None: automatic) and collective timeout.

    ``timeout=None`` means: ``ACCEL_TIMEOUT`` (seconds) from the environment, else ``timeout`` from
    the config file, else ``settings.DEFAULT_TIMEOUT_SECONDS`` (30 minutes). A collective that waits longer than
    the timeout raises on that rank instead of hanging.
    """

    backend: str | None = None
    timeout: timedelta | None = None


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
    """How prepared loaders shard data (Accelerate's ``DataLoaderConfiguration`` subset).

    ``split_batches``: False (default): each process loads whole batches of the original size
    (rank i gets global batches i, i+n, ...); True: each global batch is sliced across the
    processes (the batch size must be a multiple of the number of processes).
    ``even_batches``: True (default): the last round is padded with samples from the start of the
    epoch so every process gets the same number of batches (``gather_for_metrics`` removes them);
    False: processes may get different numbers of batches.
    ``None`` means "not set": the environment / config file decide, else the default above.
    """

    split_batches: bool | None = None
    even_batches: bool | None = None
