"""The ``Accelerator`` facade: Accelerate's API over state, strategy, data and ops modules."""

from __future__ import annotations

import builtins
import enum
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
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
from .optim import AcceleratedScheduler
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
        if mixed_precision not in (None, "no"):
            raise UnsupportedOptionError(
                "mixed_precision", mixed_precision, 'mixed_precision="no" (or None): full fp32.'
            )
        if gradient_accumulation_steps != 1:
            raise UnsupportedOptionError(
                "gradient_accumulation_steps",
                gradient_accumulation_steps,
                "gradient_accumulation_steps=1 (no accumulation).",
            )
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
        self.mixed_precision = "no"
        self.gradient_accumulation_steps = gradient_accumulation_steps
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
        """Whether this step synchronises gradients (always, without accumulation)."""
        return True

    # -- preparing objects ----------------------------------------------------------------------

    def prepare(self, *objs: Any) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; return them in the same order.

        A single argument is returned as itself, several as a tuple (like Accelerate).
        """
        prepared = tuple(self._prepare_one(obj) for obj in objs)
        return prepared[0] if len(prepared) == 1 else prepared

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
        """Place the model on the device and wrap it for the strategy (DDP on several processes)."""
        wrapped = self.strategy.wrap_model(model)
        self._models.append(wrapped)
        return wrapped

    def prepare_data_loader(self, data_loader: DataLoader) -> PreparedDataLoader:
        """Shard the loader for this process and make it yield batches on the device."""
        return prepare_data_loader(
            data_loader, self.state, self.device, self.even_batches, self._active_loaders
        )

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Optimizers need no wrapper yet: model placement keeps the same Parameter objects."""
        return optimizer

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wrap the scheduler so that it advances once per process per step (Accelerate's rule)."""
        return AcceleratedScheduler(
            scheduler, self.num_processes, self.step_scheduler_with_optimizer
        )

    # -- training step --------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)``; DDP all-reduces the gradients during it."""
        loss.backward(**kwargs)

    @contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """Gradient-accumulation context; a pass-through while gradient_accumulation_steps=1."""
        yield

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Skip DDP's gradient all-reduce in backward passes inside this context."""
        return self.strategy.no_sync(model)

    def autocast(self) -> AbstractContextManager[Any]:
        """Mixed-precision context; a no-op while mixed_precision="no"."""
        return nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` (gradients are already synchronised after backward)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module from inside any wrapper ``prepare`` added."""
        return self.strategy.unwrap_model(model)

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
