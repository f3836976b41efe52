"""Thin wrappers that give prepared LR schedulers Accelerate's stepping semantics."""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import LRScheduler


class AcceleratedScheduler:
    """Steps the wrapped scheduler once per process per ``step()`` (Accelerate's meaning).

    With ``split_batches=False`` each optimizer step consumes ``num_processes`` global batches,
    so a prepared scheduler advances ``num_processes`` times to keep the schedule in units of the
    original script's batches. On one process this is exactly the original ``step()``.
    """

    def __init__(
        self, scheduler: LRScheduler, num_processes: int, step_with_optimizer: bool = True
    ) -> None:
        self.scheduler = scheduler
        self.num_processes = num_processes
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        total_steps = getattr(self.scheduler, "total_steps", None)  # OneCycleLR must not overrun
        for _ in range(self.num_processes):
            if total_steps is not None and self.scheduler.last_epoch >= total_steps:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: delegate (optimizer, last_epoch...).
        if name == "scheduler":  # not set yet (e.g. while unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)
