"""The ``Accelerator`` facade: Accelerate's API over state, strategy, data and ops modules."""

from __future__ import annotations

import builtins
import enum
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from . import ops
from .config import DataLoaderConfiguration, DistributedDataParallelKwargs, InitProcessGroupKwargs
from .data import ActiveLoaders, PreparedDataLoader, prepare_data_loader
from .errors import PrepareError, UnsupportedOptionError
from .accumulation import GradientState, check_accumulation_steps
from .optim import AcceleratedOptimizer, AcceleratedScheduler, unwrap_optimizer
from .precision import select_precision
from .precision import unwrap as unwrap_precision
from .state import ProcessState, destroy_process_group
from .strategy import DDP, SingleDevice


class DistributedType(str, enum.Enum):
    """What kind of job this is (Accelerate's names for the kinds implemented so far)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"


class Accelerator:
    """Run a training script on 1 CPU, 1 GPU or N processes with the same code.

    Only the options this runtime implements are accepted; any other value raises
    ``UnsupportedOptionError`` naming the option.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Iterable[Any] | None = None,
        even_batches: bool | None = None,
    ) -> None:
        # Precision and accumulation (runtime/precision.py, runtime/accumulation.py).
        self.gradient_state = GradientState(gradient_accumulation_steps)
        if not device_placement:
            raise UnsupportedOptionError(
                "device_placement", device_placement, "device_placement=True."
            )
        config = dataloader_config or DataLoaderConfiguration()
        if split_batches or config.split_batches:
            raise UnsupportedOptionError(
                "split_batches", True, "split_batches=False (each process loads whole batches)."
            )

        init_kwargs = InitProcessGroupKwargs()
        ddp_kwargs = DistributedDataParallelKwargs()
        for handler in kwargs_handlers or ():
            if isinstance(handler, InitProcessGroupKwargs):
                init_kwargs = handler
            elif isinstance(handler, DistributedDataParallelKwargs):
                ddp_kwargs = handler
            else:
                raise UnsupportedOptionError(
                    "kwargs_handlers",
                    handler,
                    "InitProcessGroupKwargs or DistributedDataParallelKwargs instances.",
                )

        self.state = ProcessState.from_env(
            cpu=cpu, backend=init_kwargs.backend, timeout=init_kwargs.timeout
        )
        self.strategy: SingleDevice | DDP = (
            DDP(self.state, **ddp_kwargs.to_kwargs())
            if self.state.distributed
            else SingleDevice(self.state.device)
        )
        self.precision = select_precision(mixed_precision, self.state.device)
        self.mixed_precision = self.precision.name
        self.scaler = self.precision.scaler  # torch.amp.GradScaler with fp16, else None
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self.split_batches = False
        self.even_batches = config.even_batches if even_batches is None else even_batches
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self._models: list[nn.Module] = []
        self._active_loaders = ActiveLoaders()

    # -- who am I -------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.rank

    @property
    def local_process_index(self) -> int:
        return self.state.local_rank

    @property
    def num_processes(self) -> int:
        return self.state.world_size

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def use_distributed(self) -> bool:
        return self.state.distributed

    @property
    def distributed_type(self) -> DistributedType:
        if not self.state.distributed:
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self.device.type == "cuda" else DistributedType.MULTI_CPU

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-step synchronises gradients and steps the optimizer.

        Set by ``accumulate``: True every ``gradient_accumulation_steps``-th micro-step and at a
        prepared loader's last batch; always True without accumulation.
        """
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per optimizer step (``backward`` divides the loss by it)."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = check_accumulation_steps(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when fp16's GradScaler skipped the last optimizer step (inf/nan gradients)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)


    # -- preparing objects ----------------------------------------------------------------------

    def prepare(self, *objs: Any) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; return them in the same order.

        A single argument is returned as itself, several as a tuple (like Accelerate).
        """
        # Schedulers last, whatever their position: each looks up its prepared optimizer.
        prepared: list[Any] = list(objs)
        for index in sorted(range(len(objs)), key=lambda i: isinstance(objs[i], LRScheduler)):
            prepared[index] = self._prepare_one(objs[index])
        return prepared[0] if len(prepared) == 1 else tuple(prepared)


    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, nn.Module):
            return self.prepare_model(obj)
        if isinstance(obj, PreparedDataLoader):
            raise PrepareError(
                "a DataLoader was passed to prepare() twice.",
                "each DataLoader to be prepared exactly once.",
                "pass the original DataLoader to prepare() once and keep using the returned one.",
            )
        if isinstance(obj, DataLoader):
            return self.prepare_data_loader(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj)
        if isinstance(obj, LRScheduler):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Place the model on the device and wrap it for the strategy (DDP on several processes).

        With fp16/bf16 its forward runs under autocast and returns fp32 outputs; the user's module
        itself is never modified (see runtime/precision.py).
        """
        wrapped = self.precision.wrap_model(self.strategy.wrap_model(model))
        self._models.append(wrapped)
        return wrapped

    def prepare_data_loader(self, data_loader: DataLoader) -> PreparedDataLoader:
        """Shard the loader for this process and make it yield batches on the device."""
        return prepare_data_loader(
            data_loader, self.state, self.device, self.even_batches, self._active_loaders
        )

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        """Wrap the optimizer: no-op steps while accumulating, GradScaler steps with fp16."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        wrapped = AcceleratedOptimizer(optimizer, self.gradient_state, self.scaler)
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wrap the scheduler with Accelerate's stepping rule (see ``AcceleratedScheduler``)."""
        inner = unwrap_optimizer(scheduler.optimizer)
        wrapped = AcceleratedScheduler(
            scheduler,
            self.num_processes,
            self.step_scheduler_with_optimizer,
            optimizers=[o for o in self._optimizers if o.optimizer is inner],
            gradient_state=self.gradient_state,
            split_batches=bool(self.split_batches),
        )
        self._schedulers.append(wrapped)
        return wrapped


    # -- training step --------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)``, with the loss divided by ``gradient_accumulation_steps``
        and, with fp16, multiplied by the GradScaler's scale. DDP all-reduces during it unless
        this is a non-synchronising micro-step of ``accumulate``.
        """
        steps = self.gradient_state.num_steps
        if steps > 1:
            loss = loss / steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    @contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """One micro-step of gradient accumulation (Accelerate's ``accumulate``).

        Sets ``sync_gradients`` (every ``gradient_accumulation_steps``-th call, and at the last
        batch of the prepared loader being iterated). On the other micro-steps DDP's all-reduce is
        skipped for ``models`` and the prepared optimizers/schedulers do not step.
        """
        active = self._active_loaders.current
        sync = self.gradient_state.advance(active is not None and active.end_of_dataloader)
        if sync or not self.state.distributed:
            yield
            return
        with ExitStack() as stack:
            for model in models:
                stack.enter_context(self.strategy.no_sync(model))
            yield


    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Skip DDP's gradient all-reduce in backward passes inside this context."""
        return self.strategy.no_sync(model)

    def autocast(self) -> AbstractContextManager[Any]:
        """``torch.autocast`` for the mixed precision (fp16/bf16); a no-op with "no"."""
        return self.precision.autocast()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """fp16: divide the gradients by the loss scale (once per step); otherwise nothing."""
        if self.scaler is None:
            return
        for wrapped in self._optimizers:
            if optimizer is None or optimizer is wrapped or optimizer is wrapped.optimizer:
                wrapped.unscale_gradients()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` on unscaled gradients; returns the total norm.

        With fp16 the gradients are unscaled first (once per optimizer step). On an fp16
        micro-step that does not synchronise, the still-scaled, still-accumulating gradients are
        left alone: nothing is clipped and the norm of the unscaled gradients is returned.
        """
        if self.scaler is not None and not self.gradient_state.sync_gradients:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            grads = [p.grad for p in params if p.grad is not None]
            return torch.nn.utils.get_total_norm(grads, norm_type) / self.scaler.get_scale()
        self.unscale_gradients()
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float
    ) -> None:
        """``torch.nn.utils.clip_grad_value_`` on unscaled gradients (fp16: unscales first).

        Like ``clip_grad_norm_``, does nothing on an fp16 micro-step that does not synchronise.
        """
        if self.scaler is not None and not self.gradient_state.sync_gradients:
            return
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        """The user's module from inside any wrapper ``prepare`` added.

        The user's module is never modified by ``prepare`` (its ``forward`` is its own), so
        ``keep_fp32_wrapper`` (accepted for Accelerate compatibility) changes nothing.
        """
        return self.strategy.unwrap_model(unwrap_precision(model))


    # -- processes ------------------------------------------------------------------------------

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier: every process waits here until all have arrived (no-op on one process)."""
        ops.barrier(self.state)

    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (or nested structures of them) from all processes along dim 0."""
        return ops.gather(tensor, self.state)

    def gather_for_metrics(self, input_data: Any) -> Any:
        """``gather``, minus the samples even-batches padding added on the loader's last batch.

        Over a whole epoch of a prepared loader this returns exactly ``len(dataset)`` items.
        """
        gathered = self.gather(input_data)
        active = self._active_loaders.current
        if active is None or not active.end_of_dataloader or active.loader.remainder <= 0:
            return gathered
        keep = active.loader.remainder
        return ops.apply_to_tensors(gathered, lambda t: t[:keep])

    def save(self, obj: Any, f: str | Path, safe_serialization: bool = False) -> None:
        """``torch.save(obj, f)`` on the main process only."""
        if safe_serialization:
            raise UnsupportedOptionError(
                "safe_serialization", True, "safe_serialization=False (torch.save format)."
            )
        if self.is_main_process:
            torch.save(obj, f)

    def end_training(self) -> None:
        """Finish the job: wait for every process, then destroy the process group."""
        if self.state.distributed:
            ops.barrier(self.state)
        destroy_process_group()
