"""The ``zero1`` strategy: DDP for the model, the optimizer state sharded (ZeRO stage 1).

``prepare(optimizer)`` replaces the user's optimizer with a
``torch.distributed.optim.ZeroRedundancyOptimizer`` built from the same parameter groups, the same
optimizer class and the same hyperparameters: each rank keeps the state (Adam's moments, ...) of
about 1/N of the parameters, updates those after the all-reduced backward, and broadcasts them to
the other ranks. Parameters and gradients stay whole on every rank (that is DDP).

The user's optimizer must not have stepped yet (its state would be dropped); the error says so.
``optimizer.state_dict()`` of a ZeroRedundancyOptimizer needs ``consolidate_state_dict()`` first
(a gather on rank 0); ``save_state`` does not use it: it writes each rank's shard through
torch.distributed.checkpoint (runtime/sharded_checkpoint.py).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from .ddp import DDPStrategy
from .errors import PrepareError


class ZeroOneStrategy(DDPStrategy):
    """``"zero1"``: ``DDPStrategy`` plus ``ZeroRedundancyOptimizer`` for every prepared optimizer."""

    name: ClassVar[str] = "zero1"
    sharded: ClassVar[bool] = True

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not self.distributed or isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer
        if optimizer.state:
            raise PrepareError(
                f"strategy zero1: the {type(optimizer).__name__} passed to prepare() has already "
                "stepped, and its state cannot be sharded afterwards.",
                "an optimizer that has not stepped yet.",
                "call accelerator.prepare(model, optimizer) before the first optimizer.step(), or "
                "restore the state with accelerator.load_state(...) after prepare.",
            )
        groups: list[dict[str, Any]] = [
            {key: value for key, value in group.items() if key != "initial_lr"}
            for group in optimizer.param_groups
        ]
        # defaults may hold keys the constructor does not take (AdamW's decoupled_weight_decay).
        accepted = inspect.signature(type(optimizer).__init__).parameters
        hyper = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
        sharded = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **hyper)
        # An LR scheduler built on the user's optimizer before prepare() set initial_lr there.
        for source, target in zip(optimizer.param_groups, sharded.param_groups):
            if "initial_lr" in source:
                target["initial_lr"] = source["initial_lr"]
        return sharded

    def local_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer.optim
        return optimizer

    def after_load(self, optimizer: torch.optim.Optimizer) -> None:
        # The checkpoint restored the hyperparameters (lr, ...) into the ZeroRedundancyOptimizer's
        # own groups; its partition's groups get them at the next step anyway, and now already.
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            for local, outer in zip(optimizer.optim.param_groups, optimizer.param_groups):
                local.update({k: v for k, v in outer.items() if k != "params"})
