"""The keyword arguments of a removed hand-written `DistributedDataParallel` wrap, for AM007.

`model = DDP(model, device_ids=[gpu], broadcast_buffers=False)` goes (`accelerator.prepare`
wraps the model), but its options are part of the training: `broadcast_buffers=False` keeps each
process's BatchNorm statistics its own, `find_unused_parameters=True` lets a model whose forward
skips parameters train at all on N processes. So the options DDP takes from the Accelerator go
to it, `Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])`,
which hands them to the `DistributedDataParallel` that `prepare` builds on N processes:

- carried: `dim`, `broadcast_buffers`, `bucket_cap_mb`, `find_unused_parameters`,
  `gradient_as_bucket_view`, `static_graph` (by keyword or by position), when not written with
  DDP's default value;
- dropped without a word: `device_ids` and `output_device` (the Accelerator places the model on
  this process's device) and `check_reduction` (DDP ignores it);
- reported at the wrap, with the option named: any other option (`process_group=`, `init_sync=`,
  `forward_sync_buffers=`, `mixed_precision=`, `device_mesh=`, ...: the Accelerator wraps the
  model over the launcher's whole group with DDP's defaults for them), `**options` the migration
  cannot read, a value that cannot be written where the Accelerator is created (it reads a name
  of another function than the one creating it, such as `self.find_unused` in a trainer's
  constructor, or a name bound only after the Accelerator is created: `args.x` when the Accelerator
  comes before `args = parser.parse_args()`; `create_accelerator` checks the latter), and two
  wraps with different values for one option (a GAN's generator with `broadcast_buffers=False`,
  its discriminator without: the Accelerator passes one set of options to every model it
  prepares; the options they agree on are carried).

A literal value, a module-level constant, or (in the function creating the Accelerator) a name
bound before it, is carried as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Scope
from migrate.edits import EditPlan
from migrate.rules.base import names_read

DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})

# DistributedDataParallel's parameters in order, for options passed by position.
_POSITIONAL = (
    "module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync", "process_group",
    "bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph",
)
# The options `DistributedDataParallelKwargs` takes (the runtime's and HF Accelerate's), with the
# code of DDP's own defaults: a default written out needs no handler.
CARRIED = {
    "dim": ("0",),
    "broadcast_buffers": ("True", "None"),
    "bucket_cap_mb": ("None", "25"),
    "find_unused_parameters": ("False",),
    "gradient_as_bucket_view": ("False",),
    "static_graph": ("False",),
}
_PLACED = frozenset({"module", "device_ids", "output_device"})  # the Accelerator places the model
_IGNORED = frozenset({"check_reduction"})  # deprecated: DDP only warns about it


@dataclass(frozen=True)
class Wrap:
    """A removed `DDP(...)` call: where it was, and the model it wrapped (for messages)."""

    call: cst.Call
    scope: Scope
    model: str


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _literal(value: cst.BaseExpression) -> bool:
    if type(value) is cst.UnaryOperation:
        value = value.expression
    if type(value) is cst.Name:
        return value.value in ("True", "False", "None")
    return type(value) in (cst.Integer, cst.Float, cst.SimpleString)


def _module_scope(scope: Scope) -> Scope:
    while scope.parent is not None:
        scope = scope.parent
    return scope


def _visible_from(value: cst.BaseExpression, wrap: Wrap, accelerator_scope: Scope) -> str | None:
    """None where `value` can be written in the Accelerator's scope, else the name that cannot."""
    if _literal(value) or wrap.scope is accelerator_scope:
        return None  # names of the creating function: `create_accelerator` checks they are bound by then
    module = _module_scope(wrap.scope)
    for name in names_read(value):
        scope: Scope | None = wrap.scope
        while scope is not None and scope is not module and not scope.binds(name):
            scope = scope.parent
        if scope is not module or not module.binds(name):
            return name  # a local of the wrap's function (or a class's), not a module-level constant
    return None


def carry(plan: EditPlan, code: str, wraps: Sequence[Wrap], accelerator_scope: Scope) -> None:
    """Request the removed wraps' options as `plan.ddp_kwargs`, or report those that cannot go."""
    options: list[dict[str, cst.BaseExpression]] = []
    for wrap in wraps:
        found: dict[str, cst.BaseExpression] = {}
        for index, arg in enumerate(wrap.call.args):
            if arg.star:
                plan.report(code, arg, (
                    f"`{arg.star}{_code(arg.value)}` passes options to the removed `DistributedDataParallel` of "
                    f"`{wrap.model}` that the migration cannot read, so none of them reach the Accelerator: write "
                    "the ones that differ from DDP's defaults into `DistributedDataParallelKwargs(...)` in "
                    "`Accelerator(kwargs_handlers=[...])` (adding it where the Accelerator has none; it takes "
                    + ", ".join(f"`{k}`" for k in CARRIED) + ")"),
                    unconverted=True)
                continue
            keyword = arg.keyword.value if arg.keyword is not None else (
                _POSITIONAL[index] if index < len(_POSITIONAL) else None)
            if keyword is None or keyword in _PLACED or keyword in _IGNORED:
                continue
            if keyword not in CARRIED:
                plan.report(code, arg, (
                    f"`{keyword}={_code(arg.value)}` of the removed `DistributedDataParallel` of `{wrap.model}` "
                    "cannot be carried: the Accelerator wraps the prepared model over the launcher's whole process "
                    f"group and its `DistributedDataParallelKwargs` has no `{keyword}`, so the model now trains with "
                    f"DDP's default for it. If the training does not depend on it, remove `{keyword}=` and migrate "
                    "again; otherwise keep this script's own torch.distributed setup"), unconverted=True)
                continue
            if _code(arg.value) in CARRIED[keyword]:
                continue  # DDP's default, written out
            hidden = _visible_from(arg.value, wrap, accelerator_scope)
            if hidden is not None:
                plan.report(code, arg, (
                    f"`{keyword}={_code(arg.value)}` of the removed `DistributedDataParallel` of `{wrap.model}` reads "
                    f"`{hidden}` of `{wrap.scope.qualname}`, which the Accelerator created in "
                    f"`{accelerator_scope.qualname or '<module>'}` cannot read, so the prepared model trains without it: "
                    f"pass `kwargs_handlers=[DistributedDataParallelKwargs({keyword}=...)]` to `Accelerator(...)` "
                    "there, with its value"), unconverted=True)
                continue
            found[keyword] = arg.value
        options.append(found)
    if not wraps:
        return
    keywords = [k for k in CARRIED if any(k in found for found in options)]
    for keyword in keywords:
        written = [_code(found[keyword]) if keyword in found else None for found in options]
        if len(set(written)) == 1:
            first = next(i for i, found in enumerate(options) if keyword in found)
            plan.ddp_kwargs[keyword] = (options[first][keyword], wraps[first].call)
            continue
        shown = ", ".join(
            f"`{wrap.model}` with `{keyword}={value}`" if value is not None else f"`{wrap.model}` with DDP's default"
            for wrap, value in zip(wraps, written)
        )
        where = next(i for i, found in enumerate(options) if keyword in found)
        plan.report(code, wraps[where].call, (
            f"the removed `DistributedDataParallel` wraps differ in `{keyword}` ({shown}), but the Accelerator passes "
            "one `DistributedDataParallelKwargs` to every model it prepares, so none of these values was carried and "
            f"every prepared model trains with DDP's default: choose one `{keyword}` for all of them and pass it as "
            f"`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({keyword}=...)])`"), unconverted=True)
