"""The ``Accelerator`` facade: Accelerate's API over state, strategy, data and ops modules."""

from __future__ import annotations

import builtins
import enum
import functools
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from . import ops, rng
from .config import DataLoaderConfiguration
from .connector import connect
from .checkpoint import (
    CheckpointContents,
    CheckpointError,
    ProjectConfiguration,
    check_stateful,
    checkpoints_root,
    latest_checkpoint,
    load_checkpoint,
    next_checkpoint_dir,
    rotate_checkpoints,
    save_checkpoint,
    write_file,
)
from .sharded_checkpoint import ShardedStates
from .batch_iterables import PreparedIterable
from .data import ActiveLoaders, PreparedDataLoader, prepare_data_loader
from .errors import GradientSyncError, PrepareError, UnsupportedOptionError
from .frozen_buffers import sync_frozen_buffers
from .accumulation import GradientState, check_accumulation_steps
from .optim import AcceleratedOptimizer, AcceleratedScheduler, follow_parameters, unwrap_optimizer
from . import unused_parameters
from .pickled import worker_copy
from .precision import unwrap as unwrap_precision
from .state import ProcessView, barrier, created_default_group, destroy_process_group
from .strategy import Strategy
from .tracking import GeneralTracker, Tracking
from .user_module import accept_wrapper_keys


class DistributedType(str, enum.Enum):
    """What kind of job this is (Accelerate's names for the kinds implemented so far)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"


class Accelerator(ProcessView):
    """Run a training script on 1 CPU, 1 GPU or N processes with the same code.

    Only the options this runtime implements are accepted; any other value raises
    ``UnsupportedOptionError`` naming the option. ``strategy``: ``"ddp"`` (default), ``"zero1"``,
    ``"fsdp"`` (= ``"fsdp-zero3"``), ``"fsdp-zero2"`` or a strategy object (runtime/strategy.py);
    settings are resolved by runtime/connector.py.

    Created on N processes, where it creates the process group and the processes' torch generators
    were never seeded alike, it gives every process rank 0's torch RNG state, so that what the
    script draws between ``Accelerator()`` and the first ``prepare`` call (a task, a split, the
    initial weights) is the same everywhere, as in a seeded script; that first ``prepare`` call
    seeds the other processes apart again, so the training loop draws per process as before. A
    script that seeds torch alike, one process, and a group the script created are left as they
    are (runtime/rng.py).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Iterable[Any] | None = None,
        even_batches: bool | None = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        log_with: Any = None,
        strategy: str | Strategy | None = None,
    ) -> None:
        if not device_placement:
            raise UnsupportedOptionError(
                "device_placement", device_placement, "device_placement=True."
            )
        connection = connect(
            strategy=strategy,
            kwargs_handlers=kwargs_handlers,
            dataloader_config=dataloader_config,
            mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            cpu=cpu,
            split_batches=split_batches,
            even_batches=even_batches,
        )
        settings = connection.settings
        if created_default_group():
            # unseeded processes draw alike until the first prepare call (runtime/rng.py)
            rng.align_unseeded(connection.state.rank, connection.state.device)
        self.settings_sources = dict(settings.sources)
        self.state = connection.state
        self.strategy = connection.strategy
        self.precision = connection.precision
        self.gradient_state = GradientState(settings.gradient_accumulation_steps)
        self.mixed_precision = self.precision.name
        self.scaler = self.precision.scaler  # torch.amp.GradScaler with fp16, else None
        self.split_batches = settings.split_batches
        self.even_batches = settings.even_batches
        self.timeout = settings.timeout
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        # id(user optimizer) -> the prepared one, where the strategy replaced it (zero1)
        self._replaced_optimizers: dict[int, AcceleratedOptimizer] = {}
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self._models: list[nn.Module] = []
        # DDP models whose gradient synchronisation backward has not verified yet (see backward).
        self._unverified_ddp: list[DistributedDataParallel] = []
        # Their forward pre-hooks (removed once verified): tell parameters left without a gradient
        # from a step that bypassed DDP's forward.
        self._forward_hooks: dict[DistributedDataParallel, Any] = {}
        self._active_loaders = ActiveLoaders()
        # Checkpointing (runtime/checkpoint.py); project_dir wins over project_config's.
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(project_dir)
        self._dataloaders: list[PreparedDataLoader] = []
        self._custom_objects: list[Any] = []
        # Experiment trackers (runtime/tracking.py): written by the main process only.
        self._tracking = Tracking(
            log_with, lambda: self.project_configuration.logging_dir, self.state.is_main_process
        )

    # -- pickling (runtime/pickled.py) ----------------------------------------------------------

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled (a Dataset holding it, sent to DataLoader workers under spawn/forkserver), an
        Accelerator becomes a ``WorkerAccelerator``: this process's identity, no process group."""
        return worker_copy(self).__reduce__()

    def __copy__(self) -> Accelerator:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Accelerator:
        return self

    # -- who am I -------------------------------------------------------------------------------

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

        A single argument is returned as itself, several as a tuple (like Accelerate). An iterable
        of batches that is not a DataLoader is returned as it is on one process and as a
        ``PreparedIterable`` yielding this process's share of its batches on more (Accelerate
        returns it as it is; see docs/runtime.md); a map-style Dataset raises PrepareError on more.
        """
        # Models first (fsdp replaces their parameters, and the optimizers must see the new ones),
        # schedulers last (each looks up its prepared optimizer), whatever their positions.
        def order(index: int) -> int:
            obj = objs[index]
            return 0 if isinstance(obj, nn.Module) else 2 if isinstance(obj, LRScheduler) else 1

        prepared: list[Any] = list(objs)
        for index in sorted(range(len(objs)), key=order):
            prepared[index] = self._prepare_one(objs[index])
        rng.seed_apart_after_prepare(self.process_index)  # the first call only (runtime/rng.py)
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
        if isinstance(obj, PreparedIterable):
            raise PrepareError(
                "a batch source was passed to prepare() twice.",
                "each batch source to be prepared exactly once.",
                "pass the original object to prepare() once and keep using the returned one.",
            )
        if isinstance(obj, (str, bytes, Mapping)) or not self.state.distributed:
            return obj
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        if isinstance(obj, Iterable):
            # A batch source that is not a torch DataLoader (a torchtext iterator, a loader wrapper
            # of another library, a class of the script's own, a list of batches): this process's
            # share of what it yields (runtime/batch_iterables.py). HF Accelerate returns it as it is.
            if self.split_batches:
                raise PrepareError(
                    f"prepare() was given a {kind}, an iterable that is not a torch.utils.data.DataLoader, "
                    "with split_batches=True: its batches are of a type the runtime does not know, and cannot be "
                    "split between the processes.",
                    "a torch.utils.data.DataLoader (or a subclass) when split_batches=True.",
                    "run without split_batches (each process then takes every N-th batch of it), or build the "
                    "batches with a torch.utils.data.DataLoader and prepare that.",
                )
            return PreparedIterable(obj, self.state, self.even_batches)
        if hasattr(type(obj), "__getitem__"):  # `iter(obj)` works: a map-style Dataset
            raise PrepareError(
                f"prepare() was given a {kind}, indexable but neither a torch.utils.data.DataLoader nor an "
                f"iterable of batches; on {self.state.world_size} processes it cannot be sharded, and each "
                "process would iterate all of it.",
                "a torch.utils.data.DataLoader (or a subclass), which prepare() shards so that every sample "
                "reaches one process per epoch.",
                "wrap the dataset in a torch.utils.data.DataLoader and prepare the loader; or give each process "
                "its own share of the data (accelerator.process_index of accelerator.num_processes) and do not "
                "pass it to prepare().",
            )
        # Anything else (None, a custom scheduler) is returned as it is.
        return obj

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Place the model on the device and wrap it for the strategy (DDP on several processes).

        With fp16/bf16 its forward runs under autocast and returns fp32 outputs; under ddp and
        zero1 the user's module itself is never modified (see runtime/precision.py); it gets a
        load-state-dict hook that accepts DDP's ``module.`` keys. fsdp shards the user's module
        in place (``fully_shard``); optimizers prepared before are rebound to its sharded
        parameters. Whatever the wrapper, the prepared model's state dict, names, pickling and
        deep copies are the user's module's (runtime/user_module.py).
        """
        unused_parameters.release(model)  # prepared again: an earlier exclusion no longer holds
        placed = self.strategy.wrap_model(model)
        wrapped = self.precision.wrap_model(placed)
        accept_wrapper_keys(model)
        self._models.append(wrapped)
        for prepared in self._optimizers:  # prepared in an earlier prepare() call
            before = prepared.optimizer
            prepared.optimizer = self.strategy.prepare_optimizer(before)
            if prepared.optimizer is before:
                follow_parameters(before)
        if isinstance(placed, DistributedDataParallel) and placed not in self._unverified_ddp:
            self._unverified_ddp.append(placed)
            self._forward_hooks[placed] = placed.register_forward_pre_hook(_mark_forward)
        return wrapped

    def prepare_data_loader(self, data_loader: DataLoader) -> PreparedDataLoader:
        """Shard the loader for this process and make it yield batches on the device."""
        prepared = prepare_data_loader(
            data_loader,
            self.state,
            self.device,
            self.even_batches,
            self._active_loaders,
            split_batches=self.split_batches,
        )
        self._dataloaders.append(prepared)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        """Wrap the optimizer: no-op steps while accumulating, GradScaler steps with fp16."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        inner = self.strategy.prepare_optimizer(optimizer)
        if inner is optimizer:  # a sharding strategy's optimizer places its own state
            follow_parameters(inner)
        wrapped = AcceleratedOptimizer(inner, self.gradient_state, self.scaler)
        if inner is not optimizer:
            self._replaced_optimizers[id(optimizer)] = wrapped
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wrap the scheduler with Accelerate's stepping rule (see ``AcceleratedScheduler``)."""
        inner = unwrap_optimizer(scheduler.optimizer)
        replacement = self._replaced_optimizers.get(id(inner))
        if replacement is not None:  # the strategy replaced the optimizer the scheduler drives
            scheduler.optimizer = inner = replacement.optimizer
        wrapped = AcceleratedScheduler(
            scheduler,
            self.num_processes,
            self.step_scheduler_with_optimizer,
            optimizers=[o for o in self._optimizers if o.optimizer is inner],
            gradient_state=self.gradient_state,
            split_batches=bool(self.split_batches),
            is_main_process=self.is_main_process,
        )
        self._schedulers.append(wrapped)
        return wrapped

    # -- training step --------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)``, with the loss divided by ``gradient_accumulation_steps``
        and, with fp16, multiplied by the GradScaler's scale. DDP all-reduces during it unless
        this is a non-synchronising micro-step of ``accumulate``. The first synchronising
        backward of each prepared DDP model is checked once: gradients that differ between
        processes (a loss computed only through ``model.encoder(x)`` or another call that
        bypasses DDP's forward) raise ``GradientSyncError`` instead of training apart; trainable
        parameters that got no gradient on any process are left out of the synchronisation
        with a warning (runtime/unused_parameters.py).
        """
        steps = self.gradient_state.num_steps
        if steps > 1:
            loss = loss / steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)
        if self._unverified_ddp:
            self._verify_gradient_sync()
        sync_frozen_buffers()  # modules with nothing to train keep rank 0's buffers (runtime/frozen_buffers.py)

    def _verify_gradient_sync(self) -> None:
        """Once per prepared DDP model: check that its first synchronising backward synchronised.

        DDP synchronises a backward only when some call of the wrapper itself (``model(x)``)
        prepared it; a loss computed only through ``model.encoder(x)`` or
        ``model.compute_loss(x)`` (which the prepared model forwards to the user's module) leaves
        every gradient local, silently. Each rank sums its gradients (and their squares) and
        counts the trainable parameters left without one; one all-gather compares them. Every
        rank sees the same gathered values, so all raise together (no hang). Parameters that
        ``model(x)`` left without a gradient (run under ``torch.no_grad()``) on every rank alike
        are left out of the synchronisation instead (``_leave_out_unused``). Checked once per
        model, never again once verified.
        """
        pending = [m for m in self._unverified_ddp if m.require_backward_grad_sync]
        if not pending:
            return
        rows = []
        for model in pending:
            ignored = getattr(model, "parameters_to_ignore", ())
            total = torch.zeros(2, dtype=torch.float64, device=self.device)
            silent = trained = 0
            for name, param in model.module.named_parameters():
                if not param.requires_grad or name in ignored:
                    continue
                if param.grad is None:
                    silent += 1
                    continue
                trained += 1
                grad = param.grad.detach().to(torch.float64)
                total += torch.stack((grad.sum(), grad.square().sum()))
            forward_ran = model.__dict__.get(_FORWARD_RAN, False)
            # some parameters without a gradient in a backward that reached the model (a model
            # this backward did not reach at all is checked as before: nothing differs)
            partly = float(silent > 0 and trained > 0)
            flags = torch.tensor([partly, float(forward_ran)], dtype=torch.float64, device=self.device)
            rows.append(torch.cat((total, flags)))
        gathered = self.gather(torch.stack(rows).unsqueeze(0)).cpu()  # (ranks, models, 4)
        for index, model in enumerate(pending):
            partly, forward_ran = gathered[:, index, 2], gathered[:, index, 3]
            if bool((partly > 0).any()) and bool((forward_ran > 0).all()):
                # Trainable parameters without a gradient after model(x): DDP waited for them.
                self._leave_out_unused(model)
                self._unverified_ddp.remove(model)
                self._forward_hooks.pop(model).remove()
                continue
            values = gathered[:, index, :2]
            if not torch.isfinite(values).all():
                continue  # inf/nan gradients (fp16 overflow): check the next backward instead
            spread = (values.max(0).values - values.min(0).values).abs()
            scale = values.abs().max(0).values
            if bool((spread > 1e-6 * scale + 1e-12).any()):
                name = type(model.module).__name__
                raise GradientSyncError(
                    f"after accelerator.backward(), the gradients of the prepared {name} differ "
                    f"between the {self.num_processes} processes: DDP did not synchronise them.",
                    "a training loss computed through a call of the prepared model itself, "
                    "model(...): DDP synchronises only backward passes that its forward prepared.",
                    f"compute the loss inside {name}.forward (e.g. return self.compute_loss(x) "
                    "from forward) and call model(...); calls such as model.encoder(x) or "
                    "model.compute_loss(x) run the module's code without DDP's forward.",
                )
            self._unverified_ddp.remove(model)
            self._forward_hooks.pop(model).remove()

    def _leave_out_unused(self, model: DistributedDataParallel) -> None:
        """Trainable parameters of ``model`` got no gradient in its first synchronising backward
        on some process: leave them out of DDP's synchronisation where that is safe (the same
        ones on every process; runtime/unused_parameters.py), else raise ``GradientSyncError``.
        Every process sees the same gathered masks, so all take the same branch (no hang)."""
        names, mask = unused_parameters.silent_mask(model)
        masks = self.gather(mask.to(self.device).unsqueeze(0)).cpu()  # (ranks, parameters)
        silent = [name for name, flag in zip(names, masks[0].tolist()) if flag]
        consistent = bool((masks == masks[0]).all())
        if model.find_unused_parameters or model.static_graph:
            return  # DDP marks them ready itself: nothing was left unsynchronised
        if consistent and unused_parameters.can_exclude(model):
            if unused_parameters.exclude(model, silent, self.is_main_process):
                return
        if not silent:
            silent = [n for n, flags in zip(names, masks.T.tolist()) if any(flags)]
        raise _unused_parameters_error(type(model.module).__name__, silent, self.num_processes)

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
                stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Skip the gradient synchronisation (DDP's all-reduce, FSDP's reduce-scatter) in
        backward passes inside this context."""
        return self.strategy.no_sync(unwrap_precision(model))

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

        Under fsdp the norm is taken over every rank's shards (one all-reduce), so every rank
        clips by the same factor and gets the same total norm.

        With fp16 the gradients are unscaled first (once per optimizer step). On an fp16
        micro-step that does not synchronise, the still-scaled, still-accumulating gradients are
        left alone: nothing is clipped and the norm of the unscaled gradients is returned.
        """
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self.scaler is not None and not self.gradient_state.sync_gradients:
            grads = [p.grad for p in params if p.grad is not None]
            return torch.nn.utils.get_total_norm(grads, norm_type) / self.scaler.get_scale()
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(params, max_norm, norm_type)

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

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on all others (e.g. dataset download).

        The other processes wait at a barrier until the main process has left the block.
        """
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like ``main_process_first``, with the main process of each node going first."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextmanager
    def _goes_first(self, first: bool) -> Iterator[None]:
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` only on the main process (others return None)."""
        return self._only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` only on each node's main process (others return None)."""
        return self._only_if(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` only on the last process (others return None)."""
        return self._only_if(function, lambda: self.process_index == self.num_processes - 1)

    def on_process(
        self, function: Callable[..., Any] | None = None, process_index: int | None = None
    ) -> Callable[..., Any]:
        """Decorator: run ``function`` only on process ``process_index``.

        Use as ``@accelerator.on_process(process_index=1)``.
        """
        if process_index is None:
            raise TypeError("on_process() needs process_index=, e.g. @accelerator.on_process(process_index=1)")
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(function, lambda: self.process_index == process_index)

    @staticmethod
    def _only_if(function: Callable[..., Any], condition: Callable[[], bool]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the Accelerator's references to prepared objects, collect garbage, empty caches.

        Returns ``[None] * len(objects)``, to be assigned back (``model, opt = accelerator.free_memory(model, opt)``)
        so that the caller's references go too, as in Accelerate.
        """
        for name in ("_models", "_optimizers", "_schedulers", "_dataloaders", "_unverified_ddp"):
            if isinstance(getattr(self, name, None), list):
                setattr(self, name, [])
        self._replaced_optimizers = {}
        for hook in self._forward_hooks.values():
            hook.remove()
        self._forward_hooks = {}
        # emptied, not replaced: a loader prepared before (an evaluation loader kept across the folds
        # of a cross-validation) holds this object, and gather_for_metrics must still see its last round
        self._active_loaders.clear()
        released: list[None] = [None] * len(objects)
        del objects
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        return released

    clear = free_memory

    def wait_for_everyone(self) -> None:
        """Barrier: every process waits here until all have arrived (no-op on one process)."""
        barrier()

    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (or nested structures of them) from all processes along dim 0."""
        return ops.gather(tensor, self.state)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, minus the samples even-batches padding added on the loader's last batch.

        Over a whole epoch of a prepared loader this returns exactly ``len(dataset)`` items, also
        with ``split_batches`` and for iterable datasets. Tensors (and nested structures of only
        tensors) are gathered with ``all_gather``; anything else (lists of strings, ...), or
        everything with ``use_gather_object=True``, with ``all_gather_object``: lists are
        concatenated in rank order. With ``even_batches=False`` ranks may contribute different
        numbers of rows.
        """
        as_objects = use_gather_object or not ops.is_tensor_tree(input_data)
        if as_objects:
            gathered = ops.gather_object(input_data, self.state)
        elif not self.even_batches:
            gathered = ops.gather_uneven(input_data, self.state)
        else:
            gathered = self.gather(input_data)
        keep = self._real_samples_in_last_round()
        if keep is None:
            return gathered
        if isinstance(keep, list):  # a kept DistributedSampler's padding (see runtime/data.py)
            if as_objects:
                return [gathered[i] for i in keep]
            return ops.apply_to_tensors(
                gathered, lambda t: t[torch.tensor(keep, device=t.device)]
            )
        if as_objects:
            return gathered[:keep]
        return ops.apply_to_tensors(gathered, lambda t: t[:keep])

    def _real_samples_in_last_round(self) -> int | list[int] | None:
        """On a loader's padded last batch: how many gathered samples are real (or which rows
        are, for a kept DistributedSampler); else None."""
        active = self._active_loaders.current
        if active is None or not active.end_of_dataloader:
            return None
        if active.loader.keep_rows is not None:
            return active.loader.keep_rows
        remainder = active.loader.remainder
        if remainder < 0:  # iterable dataset of unknown length: the shard counted it
            remainder = getattr(active.loader.dataset, "remainder", 0)
        return remainder if remainder > 0 else None

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce ``tensor`` (or a nested structure of tensors) across processes.

        ``reduction``: ``"sum"`` (default) or ``"mean"``; the result is multiplied by ``scale``.
        The input is not modified. On one process: a copy of the input (times ``scale``).
        """
        return ops.reduce(tensor, self.state, reduction=reduction, scale=scale)

    def share_selection(self, selection: torch.Tensor | int) -> torch.Tensor:
        """This process's share of the samples a full-batch step selects (a runtime extension: HF
        Accelerate has no equivalent).

        ``selection`` is a 1-D index tensor (``idx_train``) or a 1-D boolean mask (``train_mask``)
        over the rows of an output computed for every sample at once (a graph network's nodes), or
        an int ``n``: every row of a step over ``n`` fixed rows (``share_selection(len(inputs))``,
        read as ``torch.arange(n)``; then ``inputs[rows]``, ``targets[rows]``).
        On one process it is returned as it is. On N processes the selected positions (a mask's
        ``True`` positions, in order) are padded by wrapping around to a multiple of N, as
        ``DistributedSampler`` pads, and process r keeps positions r, r+N, ...: an index tensor
        (on the selection's device) that selects ``ceil(n / N)`` rows on every process, so a mean
        loss over them, averaged by the prepared model's gradient all-reduce, is the mean over all
        selected samples (up to the repeated padding ones). Every process must hold the same
        selection: the first call on N processes compares them (one small ``all_gather_object``)
        and raises ``ValueError`` on every process when they differ (a selection drawn from an
        RNG seeded apart, say); later calls communicate nothing.
        """
        if isinstance(selection, int) and not isinstance(selection, bool) and selection >= 0:
            selection = torch.arange(selection)
        if not isinstance(selection, torch.Tensor) or selection.dim() != 1:
            raise ValueError(
                "share_selection takes a 1-D index tensor or boolean mask over the samples, or their count; got "
                f"{type(selection).__name__}" + (f" of shape {tuple(selection.shape)}"
                                                  if isinstance(selection, torch.Tensor) else "")
            )
        processes = self.num_processes
        if processes == 1:
            return selection
        positions = selection.nonzero().flatten() if selection.dtype == torch.bool else selection
        count = positions.numel()
        if not getattr(self, "_selection_checked", False):
            self._selection_checked = True
            digest = (count, int(positions.sum().item()) if count else 0,
                      int((positions * positions).sum().item()) if count else 0)
            seen = ops.gather_object([digest], self.state)
            if any(other != seen[0] for other in seen):
                raise ValueError(
                    "share_selection: the processes hold different selections (count, sum, sum of squares "
                    f"per process: {seen}); build the index or mask alike on every process (the same seed, "
                    "or from the same data) so that each process can take its own share of it"
                )
        if count == 0:
            return positions
        total = -(-count // processes) * processes
        if total > count:
            repeats = -(-total // count)
            positions = positions.repeat(repeats)[:total]
        return positions[self.process_index::processes]

    def share_streams(self, batched: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This process's share of the independent streams of a batchified sequence tensor (a
        runtime extension: HF Accelerate has no equivalent).

        ``batched`` holds one stream per index of ``dim`` (``ids`` of shape (batch_size,
        num_tokens) for truncated backpropagation through time: ``dim=0``; the word language
        model's (num_tokens, batch_size): ``dim=1``). On one process it is returned as it is. On N
        processes, process r keeps streams r, r+N, ... whole and in order (the stream positions
        padded by wrapping around to a multiple of N, as ``DistributedSampler`` pads), so every
        process holds ``ceil(batch_size / N)`` streams and the same number of time steps: a mean
        loss over them, averaged by the prepared model's gradient all-reduce, is the mean over all
        streams (up to the repeated padding ones). Every process must hold a tensor of the same
        shape: each call on N processes compares the shapes (one small ``all_gather_object``) and
        raises ``ValueError`` on every process when they differ.
        """
        if not isinstance(batched, torch.Tensor) or batched.dim() < 2 or not -batched.dim() <= dim < batched.dim():
            raise ValueError(
                "share_streams takes a tensor of at least 2 dimensions and the dimension of its streams; got "
                f"{type(batched).__name__}" + (f" of shape {tuple(batched.shape)}, dim={dim}"
                                                if isinstance(batched, torch.Tensor) else "")
            )
        processes = self.num_processes
        if processes == 1:
            return batched
        seen = ops.gather_object([tuple(batched.shape)], self.state)
        if any(other != seen[0] for other in seen):
            raise ValueError(
                f"share_streams: the processes hold tensors of different shapes ({seen}); batchify the same "
                "data alike on every process so that each can take its own share of the streams"
            )
        count = batched.size(dim)
        total = -(-count // processes) * processes
        positions = torch.arange(total, device=batched.device) % count
        return batched.index_select(dim, positions[self.process_index::processes])

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad tensors along ``dim`` to the largest size on any process, so they can be gathered."""
        return ops.pad_across_processes(
            tensor, self.state, dim=dim, pad_index=pad_index, pad_first=pad_first
        )

    # -- checkpoints (runtime/checkpoint.py) -----------------------------------------------------

    @property
    def project_dir(self) -> str | None:
        """The project directory (automatic checkpoints go to ``<project_dir>/checkpoints``)."""
        return self.project_configuration.project_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatic checkpoint gets (``checkpoint_<save_iteration>``)."""
        return self.project_configuration.iteration

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore ``objects`` (anything with state_dict/load_state_dict) with the state.

        They are restored in registration order, so register the same objects in the same order
        before ``load_state``.
        """
        for obj in objects:
            check_stateful(obj)
        self._custom_objects.extend(objects)

    def _checkpoint_contents(self) -> CheckpointContents:
        scaler = getattr(self, "scaler", None)
        if scaler is None:
            scaler = getattr(getattr(self, "precision", None), "scaler", None)
        gradient_state = getattr(self, "gradient_state", None)
        extra: dict[str, Any] = {}
        if isinstance(getattr(gradient_state, "step", None), int):
            extra["accumulation_step"] = gradient_state.step  # type: ignore[union-attr]
        return CheckpointContents(
            models=[self.unwrap_model(model) for model in self._models],
            optimizers=list(getattr(self, "_optimizers", ())),
            schedulers=list(getattr(self, "_schedulers", ())),
            dataloaders=list(self._dataloaders),
            custom_objects=list(self._custom_objects),
            scaler=scaler if callable(getattr(scaler, "state_dict", None)) else None,
            extra=extra,
        )

    def _sharded_states(self) -> ShardedStates:
        """The models and this rank's optimizers as torch.distributed.checkpoint saves them."""
        strategy = self.strategy
        return ShardedStates(
            models=[self.unwrap_model(model) for model in self._models],
            optimizers=[o.optimizer for o in self._optimizers],
            local=[strategy.local_optimizer(o.optimizer) for o in self._optimizers],
        )

    def save_state(
        self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = False
    ) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, loader positions and registered
        objects to ``output_dir`` (atomically); every process must call it. Returns the directory.

        Under zero1 and fsdp the models and optimizers go through torch.distributed.checkpoint:
        each rank writes its own shards (nothing is gathered), and the checkpoint loads at any
        number of processes (runtime/sharded_checkpoint.py).

        Without ``output_dir``, automatic naming must be on
        (``ProjectConfiguration(automatic_checkpoint_naming=True)``): the checkpoint goes to
        ``<project_dir>/checkpoints/checkpoint_<i>`` and, after it is written, only the newest
        ``total_limit`` checkpoints are kept.
        """
        if safe_serialization:
            raise UnsupportedOptionError(
                "safe_serialization", True, "safe_serialization=False (torch.save format)."
            )
        config = self.project_configuration
        if output_dir is None and not config.automatic_checkpoint_naming:
            raise CheckpointError(
                "save_state() was called without output_dir and automatic checkpoint naming is off.",
                "a directory, or ProjectConfiguration(automatic_checkpoint_naming=True).",
                "call save_state('some/dir'), or create the Accelerator with project_dir=... and "
                "project_config=ProjectConfiguration(automatic_checkpoint_naming=True).",
            )
        target = next_checkpoint_dir(config) if output_dir is None else Path(output_dir)
        sharded = self._sharded_states() if self.strategy.sharded else None
        saved = save_checkpoint(target, self._checkpoint_contents(), self.state, sharded)
        if output_dir is None:  # automatic naming: rotate only after the new one is complete
            if self.is_main_process:
                rotate_checkpoints(checkpoints_root(config), config.total_limit)
            self.wait_for_everyone()
            config.iteration += 1
        return str(saved)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, **load_model_func_kwargs: Any) -> None:
        """Restore everything ``save_state`` wrote; the next steps continue the saved trajectory.

        Prepare (and register) the same objects in the same order first. Without ``input_dir``
        the newest automatic checkpoint is loaded and the numbering continues after it.
        ``load_model_func_kwargs`` go to each model's ``load_state_dict`` (e.g. ``strict=False``).
        """
        config = self.project_configuration
        if input_dir is None:
            if not config.automatic_checkpoint_naming:
                raise CheckpointError(
                    "load_state() was called without input_dir and automatic checkpoint naming is off.",
                    "a checkpoint directory, or ProjectConfiguration(automatic_checkpoint_naming=True).",
                    "call load_state('path/to/checkpoint').",
                )
            number, path = latest_checkpoint(config)
            config.iteration = number + 1
        else:
            path = Path(input_dir)
        extra = load_checkpoint(
            path,
            self._checkpoint_contents(),
            self.state,
            load_model=lambda model, weights: model.load_state_dict(weights, **load_model_func_kwargs),
            sharded=self._sharded_states(),
        )
        for optimizer in self._optimizers:
            self.strategy.after_load(optimizer.optimizer)
        gradient_state = getattr(self, "gradient_state", None)
        if "accumulation_step" in extra and gradient_state is not None:
            gradient_state.step = int(extra["accumulation_step"])

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = False,
    ) -> None:
        """Write the unwrapped model's state dict to ``save_directory/pytorch_model.bin``.

        Written by the main process; the file is written to a temporary name and renamed, so a
        crash never leaves a truncated file. One file whatever ``max_shard_size`` (accepted for
        Accelerate compatibility); read it with ``torch.load(path, weights_only=True)``. Under
        fsdp every process must call it (the shards are gathered, see ``get_state_dict``).
        """
        if safe_serialization:
            raise UnsupportedOptionError(
                "safe_serialization", True, "safe_serialization=False (torch.save format)."
            )
        weights = self.get_state_dict(model)
        if not self.is_main_process:
            return
        directory = Path(save_directory)
        if directory.exists() and not directory.is_dir():
            raise CheckpointError(
                f"save_model was given {directory}, which is a file.",
                "a directory to write pytorch_model.bin into.",
                "pass a directory path (it is created if missing).",
            )
        directory.mkdir(parents=True, exist_ok=True)
        temp = directory / ".pytorch_model.bin.tmp"
        write_file(weights, temp)
        os.replace(temp, directory / "pytorch_model.bin")

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's whole state dict with plain tensors (the user's module's keys).

        Under fsdp every process must call it: the shards are gathered to the main process
        (on CPU), which gets the whole dict; the other ranks get an empty dict. Under ddp and
        zero1 every rank holds the whole model and gets its ``state_dict()``. ``unwrap`` is
        accepted for Accelerate compatibility (the keys are always the user's module's).
        """
        return self.strategy.full_state_dict(unwrap_precision(model))

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A loader that skips the first ``num_batches`` batches of each iteration (Accelerate).

        Skipped batches of a map-style dataset are never loaded. Use the result for the epoch you
        resume in. After ``load_state`` the prepared loaders already continue at the saved batch:
        calling this with that same number does not skip twice (``num_batches`` replaces it).
        """
        if not isinstance(dataloader, PreparedDataLoader):
            raise PrepareError(
                f"skip_first_batches got a {type(dataloader).__name__} that was not prepared.",
                "a DataLoader returned by accelerator.prepare(...).",
                "prepare the DataLoader first, then call skip_first_batches on the prepared one.",
            )
        return dataloader.skip_first_batches(num_batches)

    def save(self, obj: Any, f: str | Path, safe_serialization: bool = False) -> None:
        """``torch.save(obj, f)`` on the main process only.

        Under fsdp a prepared model's own ``state_dict()`` holds this rank's shards (DTensors);
        saved from the main process it would be rank 0's shards, not the model, so such an
        ``obj`` is refused on every process with the fix: ``accelerator.get_state_dict(model)``
        called by every process (or ``save_model``).
        """
        if safe_serialization:
            raise UnsupportedOptionError(
                "safe_serialization", True, "safe_serialization=False (torch.save format)."
            )
        sharded = _sharded_entries(obj)
        if sharded:
            raise CheckpointError(
                f"save({f!s}) was given {len(sharded)} sharded tensors (DTensor, e.g. "
                f"{sharded[0]!r}): under a sharded strategy they are only this rank's part.",
                "whole tensors, e.g. the dict returned by accelerator.get_state_dict(model).",
                "call `weights = accelerator.get_state_dict(model)` on EVERY process (outside any "
                "`if accelerator.is_main_process:`), then `accelerator.save(weights, path)`; or "
                "`accelerator.save_model(model, directory)` on every process.",
            )
        if self.is_main_process:
            torch.save(obj, f)

    # -- experiment trackers (runtime/tracking.py) -----------------------------------------------

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The trackers this process writes to (empty on processes other than the main one)."""
        return list(self._tracking.trackers)

    @property
    def logging_dir(self) -> str | None:
        """Where file trackers write: ``<logging_dir>/<project_name>`` (``project_dir`` by default)."""
        return self.project_configuration.logging_dir

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the trackers of ``log_with`` for ``project_name`` and record ``config`` (main process).

        ``init_kwargs`` maps a tracker name to its constructor's keyword arguments
        (``{"wandb": {"mode": "offline"}}``).
        """
        self._tracking.init(project_name, config, init_kwargs)

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
        *,
        samples: float | None = None,
        tokens: float | None = None,
    ) -> None:
        """Write ``values`` to every tracker (main process only); tensors are logged as numbers.

        ``samples`` / ``tokens``: how many this process handled since the previous call with counts;
        adds ``throughput/samples_per_sec`` and ``throughput/tokens_per_sec`` (see runtime/tracking.py).
        """
        self._tracking.log(values, step, log_kwargs, self.num_processes, samples=samples, tokens=tokens)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker named ``name`` (its library object with ``unwrap=True``); a no-op one on
        processes that do not write."""
        return self._tracking.get(name, unwrap)

    def end_training(self) -> None:
        """Finish the job: close the trackers, wait for every process, then destroy the process
        group the runtime created (a group the script initialised itself is left for the script
        to destroy)."""
        self._tracking.finish()
        barrier()
        destroy_process_group()


def _sharded_entries(obj: Any, prefix: str = "") -> list[str]:
    """The keys (dotted paths) of DTensors inside ``obj``'s dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        if not torch.distributed.is_available():
            return []
        from torch.distributed.tensor import DTensor

        return [prefix or "<tensor>"] if isinstance(obj, DTensor) else []
    if isinstance(obj, dict):
        items = ((f"{prefix}.{k}" if prefix else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(obj))
    else:
        return []
    return [path for key, value in items for path in _sharded_entries(value, key)]



_FORWARD_RAN = "_accel_forward_ran"


def _mark_forward(model: nn.Module, args: Any) -> None:
    """Forward pre-hook of a prepared DDP model until its gradient sync is verified. A module-level
    function and a flag in the instance dict (not through PreparedDDP's attribute forwarding), so
    the model still pickles and deep-copies without the Accelerator."""
    model.__dict__[_FORWARD_RAN] = True


def _unused_parameters_error(name: str, silent: list[str], processes: int) -> GradientSyncError:
    """Why DDP left a backward unsynchronised when some trainable parameters got no gradient:
    DDP all-reduces a bucket of gradients only once every parameter in it has one, so a part
    computed under ``torch.no_grad()`` (a frozen backbone whose parameters still require grad)
    keeps its bucket, and the parameters sharing it, local to each process. Raised where the
    runtime cannot leave them out by itself (runtime/unused_parameters.py)."""
    shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
    return GradientSyncError(
        f"after accelerator.backward(), the gradients of the prepared {name} differ between the "
        f"{processes} processes: {len(silent)} of its trainable parameters got no gradient ({shown}), "
        "so DDP never synchronised the gradients that share their buckets. The runtime leaves such "
        "parameters out of the synchronisation only when they are the same on every process and "
        "the model uses neither gradient_as_bucket_view nor sparse gradients.",
        "every parameter that requires grad gets a gradient in each backward (DDP waits for all of "
        "them); a part run under torch.no_grad() or left out of the loss still requires grad.",
        "freeze what is not trained before accelerator.prepare (`for p in "
        "model.backbone.parameters(): p.requires_grad_(False)`), or let DDP look for unused "
        "parameters: Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
        "find_unused_parameters=True)]).",
    )
