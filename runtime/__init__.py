"""Bundled distributed runtime with the Accelerate API.

Importing this package costs torch plus the standard library: it never imports libcst, typer,
rich or ``migrate``. The public names are loaded on first access (PEP 562), so ``accel --help``
and ``accel launch`` argument errors answer without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AccelError": ".errors",
    "Accelerator": ".accelerator",
    "DataLoaderConfiguration": ".config",
    "DDPStrategy": ".ddp",
    "FSDPStrategy": ".fsdp",
    "ZeroOneStrategy": ".zero",
    "DistributedDataParallelKwargs": ".config",
    "DistributedType": ".accelerator",
    "InitProcessGroupKwargs": ".config",
    "PrecisionNotSupportedError": ".precision",
    "ProcessState": ".state",
    "ProjectConfiguration": ".checkpoint",
    "UnsupportedOptionError": ".errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .accelerator import Accelerator, DistributedType
    from .ddp import DDPStrategy
    from .fsdp import FSDPStrategy
    from .zero import ZeroOneStrategy
    from .config import DataLoaderConfiguration, DistributedDataParallelKwargs, InitProcessGroupKwargs
    from .errors import AccelError, UnsupportedOptionError
    from .checkpoint import ProjectConfiguration
    from .precision import PrecisionNotSupportedError
    from .state import ProcessState


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
