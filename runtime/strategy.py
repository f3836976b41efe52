"""How models are placed and wrapped: one device, or DistributedDataParallel across ranks."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .state import ProcessState, release_at_exit


class Strategy(Protocol):
    """What the Accelerator needs from a parallelism strategy."""

    device: torch.device

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Place ``model`` on the device and wrap it for the strategy."""
        ...

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """Return the user's module from inside any wrapper added by ``wrap_model``."""
        ...

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Context in which backward passes skip gradient synchronisation."""
        ...


def _unwrap(model: nn.Module) -> nn.Module:
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


class SingleDevice:
    """One process: move the model to the device, nothing else."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return _unwrap(model)

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        return nullcontext()


class DDP:
    """Several processes: move the model, then wrap it in DistributedDataParallel."""

    def __init__(self, state: ProcessState, **ddp_kwargs: Any) -> None:
        self.state = state
        self.device = state.device
        self.ddp_kwargs = ddp_kwargs

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if isinstance(model, DistributedDataParallel):
            return model
        # DDP refuses modules without trainable parameters (e.g. a frozen teacher, a metric).
        if not any(p.requires_grad for p in model.parameters()):
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        release_at_exit(wrapped)
        return wrapped

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return _unwrap(model)

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return nullcontext()


def select_strategy(state: ProcessState) -> SingleDevice | DDP:
    """The default strategy for a process state: DDP when several processes take part."""
    return DDP(state) if state.distributed else SingleDevice(state.device)
