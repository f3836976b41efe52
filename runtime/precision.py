"""Mixed precision as small objects: ``"no"``, ``"bf16"`` and ``"fp16"`` (Accelerate's names).

Each object owns what its precision needs and nothing more:

* ``FullPrecision`` ("no"): no autocast, no scaler; prepared models are returned untouched.
* ``BF16Precision``: ``torch.autocast(device_type, dtype=torch.bfloat16)``.
* ``FP16Precision``: ``torch.autocast(device_type, dtype=torch.float16)`` plus a
  ``torch.amp.GradScaler(device_type)`` that scales the loss and skips steps with inf/nan gradients.

Prepared models run their forward under autocast and hand back floating outputs in fp32 (like
Accelerate's ``convert_outputs_to_fp32``). The user's module is never modified: a DDP wrapper the
runtime created gets the autocast forward on its own instance, any other model is wrapped in an
``AutocastModule``. ``unwrap`` therefore always returns the user's module with its original forward.

``select_precision`` checks the device honestly: it runs one tiny matmul under the requested
autocast and raises ``PrecisionNotSupportedError`` when the result is not in the requested dtype
(torch disables unsupported autocast with a warning; this runtime never falls back silently).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .errors import AccelError, UnsupportedOptionError
from .ops import apply_to_tensors
from .strategy import wrapped_owns
from .user_module import ForwardsToUserModule

PRECISIONS = ("no", "fp16", "bf16")
"""The ``mixed_precision`` values this runtime implements."""

_HALF_DTYPES = (torch.float16, torch.bfloat16)


class PrecisionNotSupportedError(AccelError):
    """The requested mixed precision cannot run on this device (no silent fallback to fp32)."""


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in _HALF_DTYPES else tensor


def convert_outputs_to_fp32(output: Any) -> Any:
    """``output`` with every fp16/bf16 tensor (also inside nested containers) cast to fp32."""
    return apply_to_tensors(output, _to_fp32)


class FullPrecision:
    """``mixed_precision="no"``: plain fp32, nothing is wrapped or scaled."""

    name = "no"
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type

    def autocast(self) -> AbstractContextManager[Any]:
        """The context prepared models run their forward in (here: nothing)."""
        return nullcontext()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Return ``model`` unchanged (fp32 needs no autocast)."""
        return model


class _AutocastPrecision(FullPrecision):
    """Shared part of bf16 and fp16: autocast in the prepared model's forward."""

    def autocast(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype)

    def autocast_forward(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """``forward`` run under this precision's autocast, with fp32 outputs."""
        device_type, dtype = self.device_type, self.dtype

        @functools.wraps(forward)
        def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                output = forward(*args, **kwargs)
            return convert_outputs_to_fp32(output)

        return forward_in_autocast

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Make ``model``'s forward autocast; never modify a module the user owns.

        A ``DistributedDataParallel`` was created by the runtime's strategy, so its own instance
        gets the autocast forward (it stays a DDP: ``no_sync`` keeps working). Any other module is
        the user's: it is wrapped in an ``AutocastModule`` instead.
        """
        if isinstance(model, AutocastModule) or getattr(model, "_accel_autocast", False):
            return model  # prepared twice: already autocasts
        if isinstance(model, DistributedDataParallel):
            model.forward = self.autocast_forward(model.forward)  # type: ignore[method-assign]
            model._accel_autocast = True  # type: ignore[assignment]
            return model
        return AutocastModule(model, self)


class BF16Precision(_AutocastPrecision):
    """``mixed_precision="bf16"``: autocast to bfloat16; no loss scaling is needed."""

    name = "bf16"
    dtype = torch.bfloat16


class FP16Precision(_AutocastPrecision):
    """``mixed_precision="fp16"``: autocast to float16 and a dynamic ``GradScaler``."""

    name = "fp16"
    dtype = torch.float16

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(device_type)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GradScaler warns and disables itself instead of failing
            self.scaler = torch.amp.GradScaler(device_type)
        if not self.scaler.is_enabled():
            raise PrecisionNotSupportedError(
                f'mixed_precision="fp16" was requested, but torch.amp.GradScaler({device_type!r}) '
                "disabled itself on this machine.",
                "a device whose GradScaler is available (CUDA, or CPU with torch >= 2.3).",
                'use mixed_precision="bf16" or "no", or run on a device that supports fp16.',
            )


class AutocastModule(ForwardsToUserModule, nn.Module):
    """Runs the wrapped module's forward under autocast and returns fp32 outputs.

    Attribute access falls through to the wrapped module (``model.fc``, ``model.config``), and
    state dicts, ``named_parameters()``/``named_modules()``/``children()``, pickling and
    ``copy.deepcopy`` give the wrapped module's keys and objects (runtime/user_module.py), so a
    one-process script saves the same checkpoints as without mixed precision. Writes of names the wrapped module
    has (``model.temperature = 0.5``) go to it, so its ``forward`` sees them; other names stay
    on the wrapper (the rule of ``runtime.ddp.PreparedDDP``).
    """

    def __init__(self, module: nn.Module, precision: _AutocastPrecision) -> None:
        super().__init__()
        self.module = module
        # Straight into __dict__: a wrapped module with these names must not receive them.
        object.__setattr__(self, "autocast_device_type", precision.device_type)
        object.__setattr__(self, "autocast_dtype", precision.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # No closure over the module, so that the wrapper holds nothing but the module.
        with torch.autocast(self.autocast_device_type, dtype=self.autocast_dtype):
            output = self.module(*args, **kwargs)
        return convert_outputs_to_fp32(output)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name[:1] != "_" and name not in self.__dict__ and wrapped_owns(self, name):
            setattr(self.__dict__["_modules"]["module"], name, value)
            return
        super().__setattr__(name, value)



def unwrap(model: nn.Module) -> nn.Module:
    """Remove an ``AutocastModule`` (a DDP keeps its autocast forward; the strategy unwraps it)."""
    while isinstance(model, AutocastModule):
        model = model.module
    return model


def _autocast_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why autocast to ``dtype`` does not work on ``device``, or None when it does."""
    device_type = device.type
    if not torch.amp.is_autocast_available(device_type):
        return f"torch.autocast does not support device type {device_type!r}"
    if device_type == "cuda" and dtype is torch.bfloat16:
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name(device)
            return f"the GPU {name!r} has no native bf16 support (compute capability < 8.0)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns and disables autocast for unsupported dtypes
        try:
            probe = torch.ones(2, 2, device=device)
            with torch.autocast(device_type, dtype=dtype):
                got = (probe @ probe).dtype
        except RuntimeError as error:
            return f"a matmul under torch.autocast({device_type!r}, dtype={dtype}) failed: {error}"
    if got != dtype:
        return (
            f"a matmul under torch.autocast({device_type!r}, dtype={dtype}) ran in {got}: "
            "this torch build does not autocast to that dtype on this device"
        )
    return None


def select_precision(mixed_precision: str | None, device: torch.device) -> FullPrecision:
    """The precision object for ``mixed_precision`` on ``device``; an error if it cannot run."""
    name = "no" if mixed_precision is None else str(mixed_precision).lower()
    if name not in PRECISIONS:
        raise UnsupportedOptionError(
            "mixed_precision", mixed_precision, f"one of {', '.join(map(repr, PRECISIONS))}."
        )
    if name == "no":
        return FullPrecision(device.type)
    cls = BF16Precision if name == "bf16" else FP16Precision
    problem = _autocast_problem(device, cls.dtype)  # type: ignore[arg-type]
    if problem is not None:
        alternative = '"bf16"' if name == "fp16" else '"fp16"'
        raise PrecisionNotSupportedError(
            f'mixed_precision="{name}" cannot run on {device}: {problem}.',
            f"a device that computes in {cls.dtype} under torch.autocast.",
            f'use mixed_precision="no" (fp32), try {alternative}, or run on a device that '
            f"supports {name}.",
        )
    return cls(device.type)
