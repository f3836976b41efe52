"""The ``fsdp`` strategies: FSDP2 (``torch.distributed.fsdp.fully_shard``), ZeRO-3 or ZeRO-2 like.

What it does: ``prepare(model)`` applies ``fully_shard`` to each block the wrap policy picks, then
to the root module. Every parameter becomes a ``DTensor`` of which each rank stores 1/N (dim 0);
gradients and optimizer state are sharded the same way. ``reshard_after_forward=True``
(``"fsdp"`` / ``"fsdp-zero3"``) frees each block's gathered parameters after its forward and
gathers them again in backward; ``False`` (``"fsdp-zero2"``) keeps them until backward is done.

Default wrap policy (``wrap_policy=None``): the outermost submodules whose class occurs at least
twice in the model and that contain other modules and parameters (transformer layers, residual
blocks); if there are none, each direct child holding parameters (children that share a
parameter with another child, e.g. tied embeddings, stay with the root). A container without a
``forward`` of its own (``nn.ModuleList``, ``nn.ModuleDict``: ``nn.Transformer``'s encoder and
decoder layer lists) is never a block: its layers are looked at instead. ``wrap_policy`` may be a
tuple of module classes or a ``callable(module) -> bool``; the root is always sharded last.

The optimizer: ``fully_shard`` replaces the module's parameters with new DTensor parameters, so an
optimizer built before ``prepare`` would step tensors the model no longer uses. ``prepare``
rebinds every prepared optimizer's ``param_groups`` to the sharded parameters (whatever order
the model and the optimizer are given in), so the script does not rebuild it. An optimizer that
has already stepped cannot be rebound (its state is whole-size): the error says to prepare
before the first step. An optimizer that is not passed to ``prepare`` is not rebound.

Mixed precision: with ``mixed_precision="bf16"``/``"fp16"`` the blocks get
``MixedPrecisionPolicy(param_dtype=<dtype>, reduce_dtype=float32)`` (the all-gathered parameters
and the forward are in the low precision; gradients are reduced and kept in fp32 shards), and the
forward also runs under the precision's autocast as under ddp.

What runs on CPU (torch 2.13, gloo): everything above, including ``set_requires_gradient_sync``
(accumulation), clip_grad_norm_ on DTensors, full and sharded state dicts. CPU offload
(``cpu_offload=True``, ``CPUOffloadPolicy``) needs a GPU: on CPU torch fails with "Cannot access
accelerator device when none is available", so the strategy refuses it up front with a message
(on CPU the parameters are in host memory already).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from .errors import PrepareError
from .frozen_buffers import keep_in_step_with_rank0
from .strategy import Strategy

WrapPolicy = tuple[type[nn.Module], ...] | Callable[[nn.Module], bool] | None


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _runs_forward(module: nn.Module) -> bool:
    """The module has a ``forward`` of its own: not a container (``nn.ModuleList``, ``nn.ModuleDict``)
    that only holds modules, which ``fully_shard`` refuses (its hooks run around ``forward``)."""
    return type(module).forward is not nn.Module.forward


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The submodules the default policy shards separately (see the module docstring)."""
    counts = Counter(type(m) for m in model.modules() if m is not model)
    blocks: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            repeated = counts[type(child)] >= 2 and any(True for _ in child.children()) and _runs_forward(child)
            if repeated and _has_params(child):
                blocks.append(child)
            else:
                visit(child)

    visit(model)
    if blocks:
        return blocks
    children = [child for child in model.children() if _has_params(child) and _runs_forward(child)]
    owners = Counter(id(p) for child in children for p in set(child.parameters()))
    return [c for c in children if all(owners[id(p)] == 1 for p in c.parameters())]


def policy_blocks(model: nn.Module, policy: WrapPolicy) -> list[nn.Module]:
    """The outermost submodules (never the root) that ``policy`` selects."""
    if policy is None:
        return default_blocks(model)
    if isinstance(policy, tuple):
        classes = policy
        policy = lambda module: isinstance(module, classes)  # noqa: E731
    chosen: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if policy(child) and _has_params(child):
                chosen.append(child)
            else:
                visit(child)

    visit(model)
    return chosen


class FSDPStrategy(Strategy):
    """``"fsdp"`` (``reshard_after_forward=True``, ZeRO-3) or ``"fsdp-zero2"`` (``False``)."""

    sharded: ClassVar[bool] = True

    def __init__(
        self,
        reshard_after_forward: bool = True,
        wrap_policy: WrapPolicy = None,
        cpu_offload: bool = False,
        mixed_precision_dtype: torch.dtype | None = None,
    ) -> None:
        """``mixed_precision_dtype`` overrides the dtype of the Accelerator's mixed precision for
        the all-gathered parameters (default: that precision's dtype, fp32 with "no")."""
        self.reshard_after_forward = reshard_after_forward
        self.wrap_policy = wrap_policy
        self.cpu_offload = cpu_offload
        self.mixed_precision_dtype = mixed_precision_dtype
        # id(original parameter) -> (weak reference to it, its sharded replacement)
        self._replaced: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = {}

    @property
    def name(self) -> str:  # type: ignore[override]
        return "fsdp-zero3" if self.reshard_after_forward else "fsdp-zero2"

    def _shard_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"reshard_after_forward": self.reshard_after_forward}
        dtype = self.mixed_precision_dtype or self.precision_dtype
        if dtype is not None:
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if self.cpu_offload:
            if self.device.type != "cuda":
                raise PrepareError(
                    f"FSDPStrategy(cpu_offload=True) was asked to offload to the CPU, but the "
                    f"model trains on {self.device}: FSDP2's CPUOffloadPolicy needs a GPU (torch "
                    "2.13 fails with 'Cannot access accelerator device when none is available').",
                    "cpu_offload=True only when the processes train on CUDA devices.",
                    "drop cpu_offload=True on CPU (the parameters already live in host memory), "
                    "or launch on GPUs.",
                )
            options["offload_policy"] = CPUOffloadPolicy()
        return options

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if not self.distributed or isinstance(model, FSDPModule):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            # a frozen module (teacher, metric) has nothing to shard or train; its buffers follow rank 0's
            return keep_in_step_with_rank0(model)
        before = dict(model.named_parameters(remove_duplicate=False))
        options = self._shard_options()
        for block in policy_blocks(model, self.wrap_policy):
            fully_shard(block, **options)
        fully_shard(model, **options)
        after = dict(model.named_parameters(remove_duplicate=False))
        for name, old in before.items():
            new = after.get(name)
            if new is not None and new is not old:
                self._replaced[id(old)] = (weakref.ref(old), new)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point ``optimizer``'s parameter groups at the sharded parameters (idempotent)."""
        stale = [p for group in optimizer.param_groups for p in group["params"] if self._sharded(p)]
        if not stale:
            return optimizer
        if any(p in optimizer.state for p in stale):
            raise PrepareError(
                f"strategy {self.name}: the {type(optimizer).__name__} passed to prepare() has "
                "already stepped, so its state is whole-size and cannot follow the sharded "
                "parameters.",
                "an optimizer that has not stepped yet.",
                "call accelerator.prepare(model, optimizer) before the first optimizer.step(), "
                "or restore the state with accelerator.load_state(...) after prepare.",
            )
        for group in optimizer.param_groups:
            group["params"] = [self._current(p) for p in group["params"]]
        return optimizer

    def _sharded(self, param: torch.Tensor) -> bool:
        entry = self._replaced.get(id(param))
        return entry is not None and entry[0]() is param

    def _current(self, param: torch.Tensor) -> torch.Tensor:
        return self._replaced[id(param)][1] if self._sharded(param) else param

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        return _gradient_sync_off(model)

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        params = [self._current(p) for p in parameters]
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        return total.full_tensor() if isinstance(total, DTensor) else total

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not isinstance(model, FSDPModule):
            return model.state_dict()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)


@contextmanager
def _gradient_sync_off(model: nn.Module) -> Iterator[None]:
    """FSDP2's ``no_sync``: gradients accumulate unsharded-and-unreduced until sync is back on."""
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
