"""The ``ddp`` strategy: every rank holds the whole model; gradients are all-reduced in backward.

On N processes a model with trainable parameters is wrapped in ``PreparedDDP``, a
``DistributedDataParallel`` that also answers for the user's module: ``model.output_shape``,
``model.encoder(x)``, ``model.some_method()`` work as they did before ``prepare`` (plain DDP
raises "'DistributedDataParallel' object has no attribute ..."). See ``PreparedDDP`` for what
reads, writes and calls that bypass DDP's forward do, and runtime/user_module.py for state dicts,
introspection and pickling, which give the user's module's keys and objects. On one process the
user's module itself is returned (moved to the device), so there is nothing to forward.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .frozen_buffers import keep_in_step_with_rank0
from .state import release_at_exit
from .strategy import Strategy, wrapped_owns
from .user_module import ForwardsToUserModule


def _unwrap(model: nn.Module) -> nn.Module:
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def _placement(module: nn.Module) -> tuple[tuple[torch.device, torch.dtype], ...]:
    return tuple((p.device, p.dtype) for p in module.parameters())


class PreparedDDP(ForwardsToUserModule, DistributedDataParallel):
    """``DistributedDataParallel`` whose attribute reads fall through to the wrapped module.

    Reads: a name the wrapper does not have itself (its own attributes, DDP's, ``module``) is
    looked up on ``self.module``, so ``model.encoder is model.module.encoder`` (identity kept:
    optimizers built from ``model.encoder.parameters()`` see the real parameters). The lookup
    runs only after normal attribute lookup failed (``__getattr__``); a DDP step passes through
    these methods twice (``self.module``, ``require_forward_param_sync``), each a dict lookup,
    no faster or slower than plain DDP within this machine's noise (about 1 µs).

    Writes: ``model.name = value`` goes to the wrapped module when that module already has
    ``name`` and the wrapper does not (``model.temperature = 0.5`` changes what ``forward``
    reads, as on one process); any other name stays on the wrapper, as with plain DDP (reads
    find it there). Names starting with ``_`` always stay on the wrapper (DDP creates some of its
    private attributes lazily). Replacing a parameter or submodule after ``prepare`` is
    forwarded with a ``RuntimeWarning``: DDP registered the old one, so the new one's gradients
    are not synchronised; replace it before ``prepare`` instead.

    Calls that bypass DDP's forward: ``model.encoder(x)`` or ``model.compute_loss(x)`` run the
    user's code directly, not ``DDP.forward``. DDP's reducer only synchronises a backward pass
    that some ``model(...)`` call of the same step prepared, so (measured, 2 gloo processes,
    tests/runtime/test_nprocess_safety.py):

    * evaluation, ``torch.no_grad()``, reading shapes or configs: fine (no collective runs, so a
      call on the main process only cannot hang);
    * a training step that calls ``model(x)`` and also ``model.encoder(y)`` before one backward:
      every gradient, including the encoder call's share, is synchronised;
    * a training step whose only forward is such a call: plain DDP silently leaves every
      gradient unsynchronised (ranks drift apart). ``Accelerator.backward`` checks the first
      synchronising backward of each prepared model once (one small all-gather in the whole
      run) and raises ``GradientSyncError`` naming the fix: compute the loss inside ``forward``.

    Routing such calls through ``DDP.forward`` (Lightning Fabric's ``mark_forward_method``) was
    rejected as a default: it would run DDP's buffer broadcast, a collective, on calls made by
    one rank only (sampling or logging on the main process), which hangs, and it makes
    ``model(x) + model.aux(x)`` fail with ``find_unused_parameters=True``.

    The user's module from the outside (``ForwardsToUserModule``, runtime/user_module.py):
    ``state_dict()`` has the user's keys, ``load_state_dict`` takes them or ``module.``-prefixed
    ones, ``named_parameters()`` / ``named_modules()`` / ``children()`` give the user's names,
    and pickling or ``copy.deepcopy`` give (a copy of) the user's module, not a DDP that needs a
    process group. ``torch.jit.trace(model, x)`` and ``SummaryWriter.add_graph`` trace the
    user's module's forward (see ``forward``). DDP itself reads ``self.module`` directly, so its
    reducer, ``no_sync`` and ``torch.compile`` behave as with plain DDP.

    ``isinstance(model, UserClass)`` stays False: the object must be a
    ``DistributedDataParallel`` (its reducer, ``no_sync``, torch.compile's DDP graph splitting
    and user code testing ``isinstance(model, DistributedDataParallel)`` rely on it), and
    faking ``__class__`` would make ``type(model)`` and ``model.__class__`` disagree, which
    pickling, ``torch.jit`` and dynamo read differently.
    """

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # Tracing (torch.jit.trace, SummaryWriter.add_graph) records the user's forward alone:
        # DDP's forward would also prepare its reducer for a backward pass that never comes
        # and broadcast buffers (a collective) on whichever ranks happen to trace.
        if torch.jit.is_tracing():
            return self.module(*inputs, **kwargs)
        return super().forward(*inputs, **kwargs)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # `model.eval().cpu()` to save a checkpoint, then `model.to(device)`: moving a parameter
        # to another device or dtype gives it a new gradient accumulator, which DDP's reducer
        # never hooked, so from then on no gradient would be averaged and the ranks would drift
        # apart without an error (measured: a double()/float() round trip on 2 gloo processes).
        # Back where prepare() put them, the reducer is built again over the same parameters, as
        # torch does when it unpickles a DDP model; elsewhere nothing changes.
        home = self.__dict__.get("_accel_placement")
        if home is None:
            home = self.__dict__["_accel_placement"] = _placement(self.module)
        result = super()._apply(fn, *args, **kwargs)
        now = _placement(self.module)
        if now != home:
            self.__dict__["_accel_moved"] = True
        elif self.__dict__.pop("_accel_moved", False):
            parameters, expect_sparse = self._build_params_for_reducer()
            mapping = self._build_debug_param_to_name_mapping(parameters)
            self._ddp_init_helper(parameters, expect_sparse, mapping, self.static_graph)
        return result

    def __getattr__(self, name: str) -> Any:
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:  # DDP's own self.module, once per step
            return modules[name]
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = modules.get("module") if modules is not None else None
            if inner is None or name.startswith("__"):
                raise
        try:
            return getattr(inner, name)
        except AttributeError:
            raise AttributeError(
                f"'{type(self).__name__}' object (a DistributedDataParallel around a "
                f"'{type(inner).__name__}') has no attribute '{name}', and neither has the "
                f"wrapped '{type(inner).__name__}'"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        # DDP writes its own attributes during every step: those leave at the first two tests.
        if name[:1] != "_" and name not in self.__dict__ and wrapped_owns(self, name):
            inner = self.__dict__["_modules"]["module"]
            if isinstance(value, (nn.Module, nn.Parameter)):
                warnings.warn(
                    f"replacing {type(inner).__name__}.{name} after prepare(): DDP registered "
                    f"the old {name}, so the new one's gradients are not synchronised across "
                    "processes. Replace it before accelerator.prepare(model).",
                    RuntimeWarning,
                    stacklevel=2,
                )
            setattr(inner, name, value)
            return
        super().__setattr__(name, value)


class DDPStrategy(Strategy):
    """``"ddp"``: move the model, then (on several processes) wrap it in DistributedDataParallel.

    ``ddp_kwargs`` go to ``DistributedDataParallel`` (``DistributedDataParallelKwargs``).
    """

    name: ClassVar[str] = "ddp"

    def __init__(self, **ddp_kwargs: Any) -> None:
        self.ddp_kwargs = ddp_kwargs

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if not self.distributed or isinstance(model, DistributedDataParallel):
            return model
        # DDP refuses modules without trainable parameters (e.g. a frozen teacher, a metric).
        if not any(p.requires_grad for p in model.parameters()):
            return keep_in_step_with_rank0(model)  # rank 0's buffers, as DDP would broadcast them
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = PreparedDDP(model, device_ids=device_ids, **self.ddp_kwargs)
        release_at_exit(wrapped)
        return wrapped

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return _unwrap(model)

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return nullcontext()
