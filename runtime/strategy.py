"""Strategies: how a model, its gradients and its optimizer state are spread over the processes.

A strategy is chosen by name with ``Accelerator(strategy=...)``, ``accel launch --strategy``, the
``ACCEL_STRATEGY`` variable or the config file's ``strategy`` key (``accel config`` asks), in that
order of precedence (see runtime/settings.py). The names, the same in ``accel estimate-memory``
and in the codemod's ``--strategy``:

* ``"ddp"`` (default): every rank holds the whole model, its gradients and its optimizer state;
  gradients are all-reduced during backward (``DistributedDataParallel``). Fastest while it fits.
* ``"zero1"``: DDP for the model, ``torch.distributed.optim.ZeroRedundancyOptimizer`` for the
  optimizer: each rank keeps the optimizer state of about 1/N of the parameters (ZeRO stage 1)
  and broadcasts its updated parameters after each step.
* ``"fsdp"`` = ``"fsdp-zero3"``: FSDP2 (``torch.distributed.fsdp.fully_shard``) with
  ``reshard_after_forward=True``: parameters, gradients and optimizer state are sharded (ZeRO-3);
  each block's parameters are all-gathered for its forward and again for its backward.
* ``"fsdp-zero2"``: FSDP2 with ``reshard_after_forward=False``: gradients and optimizer state
  sharded, parameters kept unsharded from forward to backward (ZeRO-2-like: one all-gather per
  step fewer, more memory during the step).

Passing an object gives the options: ``DDPStrategy(**ddp_kwargs)``, ``ZeroOneStrategy()``,
``FSDPStrategy(reshard_after_forward=True, wrap_policy=None, cpu_offload=False)`` (see
runtime/fsdp.py for the default wrap policy and what runs on CPU).

What a strategy owns (everything else is the same under every strategy, so the training script
is too): placing and wrapping the model (``wrap_model``), fitting the optimizer to the wrapped
parameters (``prepare_optimizer``), ``unwrap_model``, skipping gradient synchronisation while
accumulating (``no_sync``), ``clip_grad_norm_`` (the total norm over all shards), the consolidated
state dict (``full_state_dict``) and checkpoint I/O (``sharded``: torch.distributed.checkpoint
instead of one file per object, runtime/sharded_checkpoint.py).

On one process every strategy places the model on the device and wraps nothing; a sharded
strategy still writes sharded checkpoints, so that one resumes at any number of processes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from torch import nn

from .state import ProcessState


class Strategy:
    """The base strategy: one device, nothing wrapped, one process's view of everything.

    Subclasses override what their parallelism changes; ``setup`` binds the strategy to the
    process state before ``prepare`` uses it (the connector calls it).
    """

    name: ClassVar[str] = "ddp"
    sharded: ClassVar[bool] = False
    """True when checkpoints go through torch.distributed.checkpoint (each rank writes shards)."""

    state: ProcessState = ProcessState()
    precision_dtype: torch.dtype | None = None

    def setup(self, state: ProcessState, precision: Any = None) -> None:
        """Bind to the process state and the precision object (runtime/precision.py)."""
        self.state = state
        self.precision_dtype = getattr(precision, "dtype", None)

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed(self) -> bool:
        return self.state.distributed

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Place ``model`` on the device and wrap it for the strategy."""
        return model.to(self.device)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer to step: ``optimizer`` itself, refitted or replaced for the strategy."""
        return optimizer

    def local_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The torch optimizer holding this rank's optimizer state (for sharded checkpoints)."""
        return optimizer

    def after_load(self, optimizer: torch.optim.Optimizer) -> None:
        """Called with each prepared optimizer after a checkpoint restored its state."""

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module from inside any wrapper ``wrap_model`` added."""
        return model

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Context in which backward passes skip gradient synchronisation."""
        return nullcontext()

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """Clip the gradients of ``parameters``; return their total norm (over every shard)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The whole model's state dict with plain tensors, complete on the main process.

        Every process must call it (under fsdp it gathers the shards); other ranks may get an
        empty dict.
        """
        return self.unwrap_model(model).state_dict()


def wrapped_owns(wrapper: nn.Module, name: str) -> bool:
    """True when ``name`` belongs to ``wrapper.module`` and not to the wrapper itself.

    The wrapper's own names are its instance attributes, parameters, buffers, submodules
    (``module``) and anything its class defines (methods, properties such as DDP's
    ``broadcast_buffers``).
    """
    own = wrapper.__dict__
    modules = own.get("_modules")
    if modules is None or "module" not in modules or name in own:
        return False
    if name in modules or name in own.get("_parameters", ()) or name in own.get("_buffers", ()):
        return False
    if any(name in vars(klass) for klass in type(wrapper).__mro__):
        return False
    return hasattr(modules["module"], name)
