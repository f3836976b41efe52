"""The model an optimizer is built over, when it is named through the hand-wrapped model's alias.

`model_without_ddp = model`, then `if args.distributed: model = DDP(model); model_without_ddp =
model.module`, then `optimizer = create_optimizer(args, model_without_ddp)` (DeiT, ConvNeXt, MAE):
`model_without_ddp` is always the user's module and `model`, the one trained, wraps it. The model
to prepare is `model`: prepare wraps it once (the hand DDP goes, `model.module` becomes
`accelerator.unwrap_model(model)`), and `model_without_ddp` still names the user's module, which
is what the script saves and loads. Preparing the alias instead would leave the hand DDP in place
and wrap the module a second time. nanoGPT's `raw_model = model.module if ddp else model` (one
binding, both branches aliases of `model`) is the same alias, and `raw_model.configure_optimizers()`
builds the optimizer over `model`. After a migration, `model` is bound by `accelerator.prepare(...)`
instead of the hand DDP (`model_without_ddp = model` on both paths): the same alias, so a second run
changes nothing. Without a hand wrap the same holds when the training step (a loop of home that
calls backward) calls `model` and never `name`: `model_without_ddp = model` then builds the
optimizer or saves, and stays the user's module, while `model` is prepared.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.names import ImportAliases
from migrate.roles.step_aliases import used_by_step

_WRAPPERS = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel"}
)


def wrapped_model(home: Scope, name: str, aliases: ImportAliases) -> str:
    """`model` when every binding of `name` in `home` is `name = model` or `name = model.module`
    (at least one plain alias) and `home` wraps `model` by hand (`model = DDP(model, ...)`);
    otherwise `name` itself."""
    origins: set[str] = set()
    plain = False
    for binding in home.bindings.get(name, []):
        value = binding.value
        # `raw_model = model.module if ddp else model` (nanoGPT): both branches, one binding
        for branch in (value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,):
            if isinstance(branch, cst.Name):
                origins.add(branch.value)
                plain = True
            elif isinstance(branch, cst.Attribute) and branch.attr.value == "module" and isinstance(branch.value, cst.Name):
                origins.add(branch.value.value)
            elif _unwrapped(branch) is not None:
                origins.add(_unwrapped(branch))  # type: ignore[arg-type]
            else:
                return name
    if not plain or len(origins) != 1:
        return name
    (model,) = origins
    if model in home.prepared:
        return model  # migrated already: `model, optimizer = accelerator.prepare(model, ...)` replaced the hand DDP
    for binding in home.bindings.get(model, []):
        value = binding.value
        if (isinstance(value, cst.Call) and aliases.qualify(value.func) in _WRAPPERS and value.args
                and isinstance(value.args[0].value, cst.Name) and value.args[0].value.value == model):
            return model
    steps = [loop.node for loop in home.loops if loop.has_backward]
    if any(used_by_step(s, home, model) for s in steps) and not any(used_by_step(s, home, name) for s in steps):
        return model  # no hand wrap, but the step calls `model` itself: `name` stays the user's module
    return name


def _unwrapped(value: cst.BaseExpression | None) -> str | None:
    """`model` of `accelerator.unwrap_model(model)` (what a migration made of `model.module`)."""
    if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "unwrap_model"
            and len(value.args) == 1 and isinstance(value.args[0].value, cst.Name)):
        return value.args[0].value.value
    return None
