"""Which library call an expression is: the patterns of the training objects and small call predicates."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from migrate.analysis import Binding
from migrate.names import instance_attribute, root_name

if TYPE_CHECKING:
    from migrate.roles.model import Roles


OPTIMIZER = re.compile(
    r"^torch\.optim\.[A-Z]\w*$|^transformers\.(optimization\.)?(AdamW|Adafactor)$"
    r"|^torch\.distributed\.optim\.(zero_redundancy_optimizer\.)?ZeroRedundancyOptimizer$"  # AM007 unwraps it
)


SCHEDULER = re.compile(r"^torch\.optim\.lr_scheduler\.\w+$|^transformers\.(optimization\.)?get_\w*schedule\w*$")


DATALOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})


DISTRIBUTED_SAMPLER = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})

# Draws from torch's global RNG of fresh values, and the calls that seed it.
RNG_DRAWS = frozenset(
    f"torch.{name}" for name in ("randn", "rand", "randint", "normal", "randn_like", "rand_like", "randint_like")
)
RNG_SEEDS = frozenset({
    "torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
    "lightning.seed_everything", "pytorch_lightning.seed_everything", "lightning.pytorch.seed_everything",
    "transformers.set_seed", "accelerate.utils.set_seed",
})


def call_name(roles: Roles, value: cst.BaseExpression | None, pattern) -> bool:  # type: ignore[no-untyped-def]
    if type(value) is not cst.Call:
        return False
    qualified = roles.facts.aliases.qualify(value.func)
    if qualified is None:
        return False
    if isinstance(pattern, frozenset):
        return qualified in pattern
    return bool(pattern.match(qualified))


def callee(call: cst.Call) -> str:
    func = call.func
    if type(func) is cst.Attribute:
        return func.attr.value
    return func.value if type(func) is cst.Name else ""


def is_move_call(value: cst.BaseExpression | None) -> bool:
    return (
        type(value) is cst.Call
        and type(value.func) is cst.Attribute
        and value.func.attr.value in ("to", "cuda")
    )


def is_self_move(binding: Binding) -> bool:
    """`model = model.to(device)`, `model = model.eval()` (a module's `eval` and `train` return the
    module) or `model = DDP(model, ...)` rebinds a name to (a wrapper of) itself: it adds no origin
    of its own."""
    value = binding.value
    if type(value) is not cst.Call:
        return False
    if type(value.func) is cst.Attribute and value.func.attr.value in ("to", "cuda", "eval", "train"):
        return _spelled(value.func.value) == binding.name
    name = value.func.attr.value if type(value.func) is cst.Attribute else getattr(value.func, "value", "")
    return (
        name in ("DDP", "DistributedDataParallel", "DataParallel", "FSDP", "FullyShardedDataParallel")
        and bool(value.args)
        and _spelled(value.args[0].value) == binding.name
    )


def _spelled(expr: cst.BaseExpression) -> str | None:
    """The name a binding of `expr` is tracked by: `model` for `model` (or `model.x`), `self.model`
    for `self.model` (`self.model = DDP(self.model)` wraps the attribute itself)."""
    return instance_attribute(expr) or root_name(expr)


def is_accelerator_device(expr: cst.BaseExpression) -> bool:
    return (
        type(expr) is cst.Attribute
        and expr.attr.value == "device"
        and type(expr.value) is cst.Name
        and expr.value.value == "accelerator"
    )


def is_expression_statement(stmt: cst.BaseStatement, call: cst.Call) -> bool:
    return (
        type(stmt) is cst.SimpleStatementLine
        and len(stmt.body) == 1
        and type(stmt.body[0]) is cst.Expr
        and stmt.body[0].value is call
    )


HAND_WRAPPERS = frozenset({
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.nn.parallel.data_parallel.DataParallel",
})
