"""Bundled distributed runtime with the Accelerate API.

Importing this package costs torch plus the standard library: it never imports libcst, typer,
rich or ``migrate``.
"""

from .accelerator import Accelerator, DistributedType
from .config import DataLoaderConfiguration, DistributedDataParallelKwargs, InitProcessGroupKwargs
from .errors import AccelError, UnsupportedOptionError
from .state import ProcessState

__all__ = [
    "AccelError",
    "Accelerator",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "InitProcessGroupKwargs",
    "ProcessState",
    "UnsupportedOptionError",
]
