"""Prepared optimizers and LR schedulers: accumulation no-ops, fp16 loss scaling, scheduler rule.

``AcceleratedOptimizer`` IS a ``torch.optim.Optimizer`` (an LR scheduler built on it after
``prepare`` works) whose ``param_groups``, ``state``, ``defaults``, ``state_dict`` and
``load_state_dict`` are the wrapped optimizer's. On a step that does not synchronise gradients
(inside ``accumulate``) ``step`` and ``zero_grad`` do nothing. With fp16 ``step`` goes through
``GradScaler.step`` / ``update`` and records whether the update was skipped (inf/nan gradients),
without any device synchronisation beyond GradScaler's own. Without accumulation and fp16,
``step``/``zero_grad`` are exactly the wrapped optimizer's (bit-identical training).

``AcceleratedScheduler`` steps the wrapped scheduler as Accelerate does (see its docstring).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, MultiplicativeLR

from .accumulation import GradientState
from .errors import AccelError


class AcceleratedOptimizer(torch.optim.Optimizer):
    """The optimizer ``Accelerator.prepare`` returns (Accelerate's ``AcceleratedOptimizer``).

    ``Optimizer.__init__`` is deliberately not called: the parameter groups and the state stay the
    wrapped optimizer's own objects, so changes through either object are seen by both.
    """

    # Never let GradScaler hand the scaling to the wrapped optimizer (fused Adam would otherwise
    # skip the update internally, and the skip could not be observed without a device sync).
    _step_supports_amp_scaling = False

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_state: GradientState | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.scaler = scaler
        self.step_was_skipped = False
        self._unscaled = False  # GradScaler.unscale_ already ran since the last update
        self._in_scaler_step = False  # GradScaler.step is calling back into step()
        self._inner_stepped = False

    # -- the wrapped optimizer's data ---------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optimizer.load_state_dict(state_dict)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle (``torch.save({"optimizer": optimizer})``) and deep-copy as the wrapped optimizer.

        A project helper that saves whole objects writes the user's optimizer class, which a
        resumed or sibling script loads without this runtime (``max`` of a one-element tuple is
        that element: a builtin, so unpickling imports nothing of ours).
        """
        return (max, ((self.optimizer,),))

    # -- training step ------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool | None = None) -> None:  # type: ignore[override]
        """The wrapped ``zero_grad``, except on accumulation steps that do not synchronise."""
        if not self.gradient_state.sync_gradients:
            return
        if set_to_none is None:
            self.optimizer.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Update the parameters: plain, through GradScaler (fp16), or not at all (accumulating)."""
        if self._in_scaler_step:  # GradScaler found finite gradients and asks for the update
            self._inner_stepped = True
            return self.optimizer.step() if closure is None else self.optimizer.step(closure)
        if not self.gradient_state.sync_gradients:
            return None
        scaler = self.scaler
        if scaler is None:
            return self.optimizer.step() if closure is None else self.optimizer.step(closure)
        if closure is not None:
            raise AccelError(
                "optimizer.step(closure) was called with mixed_precision='fp16'.",
                "no closure: torch.amp.GradScaler does not support closures.",
                "compute the loss and call accelerator.backward(loss) before optimizer.step(), "
                'or use mixed_precision="bf16" / "no".',
            )
        self._inner_stepped = False
        self._in_scaler_step = True
        try:
            result = scaler.step(self)  # unscales (unless done), checks inf/nan, calls step()
        finally:
            self._in_scaler_step = False
        scaler.update()
        self._unscaled = False
        self.step_was_skipped = not self._inner_stepped
        return result

    def unscale_gradients(self) -> None:
        """Divide the gradients by the fp16 loss scale, at most once per optimizer step.

        Does nothing without fp16, and nothing on accumulation steps that do not synchronise (the
        next micro-batches still add scaled gradients).
        """
        if self.scaler is None or self._unscaled or not self.gradient_state.sync_gradients:
            return
        self.scaler.unscale_(self)
        self._unscaled = True

    # -- plumbing -------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: delegate to the wrapped optimizer.
        if name == "optimizer":  # not set yet (e.g. while unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:  # type: ignore[override]
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def follow_parameters(optimizer: torch.optim.Optimizer) -> None:
    """Put the optimizer's state where its parameters now are (Accelerate's ``AcceleratedOptimizer``
    does the same at ``prepare``).

    A script that resumes before ``prepare`` (``optimizer.load_state_dict(checkpoint["optimizer"])``
    while the model is still on the CPU, its ``.cuda()`` removed by the migration) has its momentum
    and Adam moments on the CPU, and ``prepare`` then moves only the parameters: the first step
    would mix devices. When some state tensor is on another device than its parameter, the state is
    loaded again through ``load_state_dict``, which places each value by torch's own rule (on its
    parameter's device and dtype; ``step`` where the optimizer keeps it). Nothing is copied when
    the state already follows its parameters (the usual case: no state before the first step)."""
    for param, state in optimizer.state.items():
        if isinstance(param, torch.Tensor) and any(
            isinstance(value, torch.Tensor) and key != "step" and value.device != param.device
            for key, value in state.items()
        ):
            optimizer.load_state_dict(optimizer.state_dict())
            return


def unwrap_optimizer(optimizer: Any) -> Any:
    """The user's optimizer from inside any ``AcceleratedOptimizer``."""
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


class AcceleratedScheduler:
    """A prepared LR scheduler with Accelerate's stepping rule.

    With ``step_with_optimizer=True`` (default) ``step()`` advances the wrapped scheduler only when
    the optimizer really updated the parameters: not on accumulation micro-steps that do not
    synchronise gradients, and not when fp16's GradScaler skipped the update (inf/nan gradients).
    It then advances ``num_processes`` times (once with ``split_batches=True``): each optimizer
    step consumes ``num_processes`` of the original script's batches, so the schedule stays in
    units of those batches. OneCycleLR is never advanced past its ``total_steps``. With
    ``step_with_optimizer=False`` every ``step()`` call advances the scheduler once. On one
    process without accumulation or fp16 this is exactly the original ``step()``.
    """

    def __init__(
        self,
        scheduler: LRScheduler,
        num_processes: int,
        step_with_optimizer: bool = True,
        optimizers: Sequence[AcceleratedOptimizer] = (),
        gradient_state: GradientState | None = None,
        split_batches: bool = False,
        is_main_process: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.num_processes = num_processes
        self.step_with_optimizer = step_with_optimizer
        self.optimizers = tuple(optimizers)
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.split_batches = split_batches
        self._steps_per_call = 1 if split_batches else num_processes
        self._ended = False  # a LambdaLR's next advance left its schedule (see _step_unless_past_end)
        self.is_main_process = is_main_process

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        for optimizer in self.optimizers:
            if optimizer.step_was_skipped:
                return
        total_steps = getattr(self.scheduler, "total_steps", None)  # OneCycleLR must not overrun
        guard = self._steps_per_call > 1 and isinstance(self.scheduler, (LambdaLR, MultiplicativeLR))
        for _ in range(self._steps_per_call):
            if total_steps is not None and self.scheduler.last_epoch >= total_steps:
                break
            if self._ended:
                break
            if guard:
                self._step_unless_past_end(*args, **kwargs)
            else:
                self.scheduler.step(*args, **kwargs)

    def _step_unless_past_end(self, *args: Any, **kwargs: Any) -> None:
        """One advance of a LambdaLR/MultiplicativeLR, undone if it leaves its schedule.

        Stepping ``num_processes`` times per optimizer step is right for a schedule sized in the
        original script's batches (an epoch loop: ``total = epochs * len(loader)`` measured before
        ``prepare``). A loop that runs a fixed number of optimizer steps (``while step <
        total_steps``) sized it in optimizer steps instead, and reaches its end after
        ``1/num_processes`` of training; a poly lambda ``(1 - e / total) ** 0.9`` then gives a
        complex learning rate and the next optimizer step crashes. Which of the two a script means
        is not visible at run time, so the advance that would leave the schedule (a learning rate
        that is complex, NaN, infinite or negative) is undone, the schedule stays at its last
        valid rate from then on, and the main process is told, once, how to get the one-process
        rates: ``Accelerator(step_scheduler_with_optimizer=False)`` (one advance per call).
        """
        scheduler = self.scheduler
        saved = dict(scheduler.__dict__)
        groups = scheduler.optimizer.param_groups
        rates = [group["lr"] for group in groups]
        scheduler.step(*args, **kwargs)
        if all(_valid_rate(group["lr"]) for group in groups):
            return
        scheduler.__dict__.update(saved)
        for group, rate in zip(groups, rates):
            group["lr"] = rate
        self._ended = True
        if self.is_main_process:
            warnings.warn(
                f"the prepared {type(scheduler).__name__} reached the end of its schedule at "
                f"step {scheduler.last_epoch}: each optimizer step advances it "
                f"{self._steps_per_call} times (once per process, Accelerate's rule for schedules "
                "sized in the original script's batches), and the next advance gives an invalid "
                "learning rate. It stays at its last rate. If the loop runs a fixed number of "
                "optimizer steps (while step < total_steps), create the Accelerator with "
                "step_scheduler_with_optimizer=False: the scheduler then advances once per "
                "scheduler.step(), with the one-process learning rates.",
                RuntimeWarning,
                stacklevel=3,
            )

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle and deep-copy as the wrapped scheduler (see ``AcceleratedOptimizer``)."""
        return (max, ((self.scheduler,),))

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: delegate (optimizer, last_epoch...).
        if name == "scheduler":  # not set yet (e.g. while unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)


def _valid_rate(rate: Any) -> bool:
    """A learning rate an optimizer can use: a real, finite, non-negative number (or tensor)."""
    if isinstance(rate, torch.Tensor):
        return not rate.is_complex() and bool(torch.isfinite(rate).all()) and bool((rate >= 0).all())
    return isinstance(rate, (int, float)) and math.isfinite(rate) and rate >= 0
