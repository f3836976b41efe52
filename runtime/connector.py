"""The connector: the Accelerator's arguments become the objects that run the job.

Lightning Fabric's split: ``connect`` resolves every setting once (explicit argument >
``ACCEL_*`` environment > config file > default, runtime/settings.py), reads ``kwargs_handlers``
once, joins the process group (``ProcessState``), and builds the ``Strategy``
(runtime/strategy.py) and the precision object (runtime/precision.py). The Accelerator only
holds the result (``Connection``) and never looks at a setting by its string name.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .config import DataLoaderConfiguration, DistributedDataParallelKwargs, InitProcessGroupKwargs
from .ddp import DDPStrategy
from .errors import UnsupportedOptionError
from .precision import FullPrecision, select_precision
from .settings import resolve
from .state import ProcessState
from .strategy import Strategy


@dataclass(frozen=True)
class Settings:
    """Every resolved setting, typed, and where each came from (``sources``)."""

    mixed_precision: str
    gradient_accumulation_steps: int
    cpu: bool
    split_batches: bool
    even_batches: bool
    timeout: timedelta
    strategy: str
    sources: Mapping[str, str]


@dataclass(frozen=True)
class Handlers:
    """The ``kwargs_handlers`` the runtime implements (defaults where none was given)."""

    init: InitProcessGroupKwargs = InitProcessGroupKwargs()
    ddp: DistributedDataParallelKwargs | None = None


@dataclass(frozen=True)
class Connection:
    """What the Accelerator runs with."""

    settings: Settings
    state: ProcessState
    strategy: Strategy
    precision: FullPrecision


def read_handlers(kwargs_handlers: Iterable[Any] | None) -> Handlers:
    """Sort ``kwargs_handlers`` by kind; anything unsupported raises naming it."""
    init = InitProcessGroupKwargs()
    ddp: DistributedDataParallelKwargs | None = None
    for handler in kwargs_handlers or ():
        if isinstance(handler, InitProcessGroupKwargs):
            init = handler
        elif isinstance(handler, DistributedDataParallelKwargs):
            ddp = handler
        else:
            raise UnsupportedOptionError(
                "kwargs_handlers",
                handler,
                "InitProcessGroupKwargs or DistributedDataParallelKwargs instances.",
            )
    return Handlers(init, ddp)


def resolve_settings(
    handlers: Handlers,
    dataloader_config: DataLoaderConfiguration | None,
    strategy: str | Strategy | None,
    **explicit: Any,
) -> Settings:
    """Resolve the settings; ``explicit`` holds the Accelerator's arguments (None: not given)."""
    loader = dataloader_config or DataLoaderConfiguration()
    if explicit.get("split_batches") is None:
        explicit["split_batches"] = loader.split_batches
    if explicit.get("even_batches") is None:
        explicit["even_batches"] = loader.even_batches
    timeout = handlers.init.timeout
    explicit["timeout"] = timeout.total_seconds() if timeout is not None else None
    explicit["strategy"] = strategy.name if isinstance(strategy, Strategy) else strategy
    values, sources = resolve(explicit)
    return Settings(
        mixed_precision=values["mixed_precision"],
        gradient_accumulation_steps=values["gradient_accumulation_steps"],
        cpu=values["cpu"],
        split_batches=values["split_batches"],
        even_batches=values["even_batches"],
        timeout=timedelta(seconds=values["timeout"]),
        strategy=values["strategy"],
        sources=sources,
    )


def build_strategy(chosen: str | Strategy, handlers: Handlers) -> Strategy:
    """The strategy object for a name (or the object given), with the handlers' options.

    The sharded strategies' modules are imported only when chosen (torch.distributed.fsdp adds
    to the import time of every script otherwise).
    """
    if isinstance(chosen, Strategy):
        strategy = chosen
    else:
        name = str(chosen).strip().lower().replace("_", "-")
        if name == "ddp":
            strategy = DDPStrategy()
        elif name == "zero1":
            from .zero import ZeroOneStrategy

            strategy = ZeroOneStrategy()
        elif name in ("fsdp", "fsdp-zero3", "fsdp-zero2"):
            from .fsdp import FSDPStrategy

            strategy = FSDPStrategy(reshard_after_forward=name != "fsdp-zero2")
        else:
            raise UnsupportedOptionError(
                "strategy", chosen, "one of 'ddp', 'zero1', 'fsdp' ('fsdp-zero3'), 'fsdp-zero2', "
                "or a strategy object (DDPStrategy, ZeroOneStrategy, FSDPStrategy)."
            )
    if handlers.ddp is not None:
        if isinstance(strategy, DDPStrategy):
            strategy.ddp_kwargs = {**handlers.ddp.to_kwargs(), **strategy.ddp_kwargs}
        else:
            warnings.warn(
                f"DistributedDataParallelKwargs are ignored under strategy {strategy.name!r} "
                "(they configure DistributedDataParallel, which ddp and zero1 use).",
                RuntimeWarning,
                stacklevel=4,
            )
    return strategy


def connect(
    *,
    strategy: str | Strategy | None,
    kwargs_handlers: Iterable[Any] | None,
    dataloader_config: DataLoaderConfiguration | None,
    **explicit: Any,
) -> Connection:
    """Resolve the settings, join the process group, build the strategy and the precision."""
    handlers = read_handlers(kwargs_handlers)
    settings = resolve_settings(handlers, dataloader_config, strategy, **explicit)
    state = ProcessState.from_env(
        cpu=settings.cpu, backend=handlers.init.backend, timeout=settings.timeout
    )
    precision = select_precision(settings.mixed_precision, state.device)
    chosen = strategy if isinstance(strategy, Strategy) else settings.strategy
    built = build_strategy(chosen, handlers)
    built.setup(state, precision)
    return Connection(settings, state, built, precision)
