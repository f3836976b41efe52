"""Save checkpoints, print and show progress bars once, from the main process.

What it does:
    `torch.save(model.state_dict(), path)` (also inside a checkpoint dict, through a name such as
    `weights = model.state_dict()`, and for `model.module`)
    becomes `accelerator.save(accelerator.unwrap_model(model).state_dict(), path)`;
    `print(...)` becomes `accelerator.print(...)`; `tqdm(...)` gets
    `disable=not accelerator.is_local_main_process`; `model.state_dict()` and
    `model.load_state_dict(...)` on a prepared model, after the prepare call, go through
    `accelerator.unwrap_model(model)` (the wrapped model's keys carry a `module.` prefix, and it
    would refuse the single-device script's checkpoint). Only in code that can reach the
    accelerator: the function that creates it, nested functions, and functions that already
    receive it.
    A checkpoint saved and then loaded again in the same function (train, save, reload for
    testing) gets `accelerator.wait_for_everyone()` before the first `torch.load` after the save.

Why:
    Every process runs the script: without this, each of N processes writes the same checkpoint
    file at once, prints every line N times and draws N progress bars. After `prepare` the model
    may be wrapped (DistributedDataParallel): its state dict would carry a `module.` prefix that
    the single-device script cannot load. Only the main process writes the checkpoint: without the
    barrier, the others would read a file it has not finished (or not started) writing.

Example:
    torch.save(model.state_dict(), "net.pt")
    -> accelerator.save(accelerator.unwrap_model(model).state_dict(), "net.pt")
    print(f"loss {loss:.3f}")  ->  accelerator.print(f"loss {loss:.3f}")

Leaves alone:
    `torch.save(model, path)` of a whole prepared module (reported: it would pickle the wrapper;
    save `accelerator.unwrap_model(model)` or its state dict), prints when the script patches
    `builtins.print` for rank 0 itself (reported), tqdm calls that already pass `disable=`, a model
    built anew after `prepare` (`model = Net()` to reload for inference: it is not wrapped),
    loads after a save inside a rank check or in another branch (a barrier there would hang), and
    prints in methods of a class that never holds the accelerator (an `nn.Module`, or a class of a
    script that creates the Accelerator at module level: nanoGPT's `configure_optimizers` and
    `DataLoaderLite`): under the script's own rank check (`if master_process:`) they are already
    main-process only; any other is reported. A print that formats the process's own rank
    (`print(f"rank {ddp_rank} sample {i}: {text}")`) is each process's on purpose and is kept.

Fix safety:
    Safe: on one process the main process is the only process.
"""

from __future__ import annotations

import re

import libcst as cst

from migrate.analysis import Scope, Site, StmtRef
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import accelerator_call, names_read, reference
from migrate.walk import Visitor, walk

CODE = "AM009"
NAME = "checkpoints-and-output"

# An `if` only some processes pass (a rank check, ours or the script's own).
_RANK_TEST = re.compile(r"main_process|rank|primary|master", re.IGNORECASE)
_TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.trange", "tqdm.auto.trange"})


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    for scope in roles.facts.scopes:
        if not roles.can_reach(scope):
            continue
        reached = scope in plan.uses_accelerator or not roles.needs_parameter(scope)
        saves: list[StmtRef] = []
        for call in scope.library_calls:
            if call.qualified == "torch.save":
                if _checkpoint(roles, plan, scope, call.call):
                    saves.append(call.where)
            elif call.qualified in _TQDM and reached:
                _quiet_progress_bar(plan, scope, call.call)
        if reached:
            _prints(roles, plan, scope)
        _unwrapped_state_dicts(roles, plan, scope)
        _wait_before_reload(plan, scope, saves)


def _wait_before_reload(plan: EditPlan, scope: Scope, saves: list[StmtRef]) -> None:
    """`accelerator.wait_for_everyone()` before the first `torch.load` that follows a checkpoint
    saved by the main process, in the innermost block holding both (not inside a rank check)."""
    if not saves:
        return
    save = min(saves, key=lambda ref: ref.order)
    loads = [c.where for c in scope.library_calls if c.qualified == "torch.load" and c.where.order > save.order]
    if not loads:
        return
    load = min(loads, key=lambda ref: ref.order)
    save_chain, load_chain = [*save.path, save], [*load.path, load]
    depth = 0
    while depth < min(len(save_chain), len(load_chain)) and save_chain[depth].stmt is load_chain[depth].stmt:
        depth += 1
    if depth == len(save_chain) or depth == len(load_chain):
        return  # saved and loaded by one statement
    before = load_chain[depth]
    if save_chain[depth].block is not before.block:
        return  # different branches of one statement: a load on a path without the save
    empty = cst.Module([])
    for outer in save_chain[:depth]:
        if type(outer.stmt) in (cst.If, cst.While) and _RANK_TEST.search(empty.code_for_node(outer.stmt.test)):
            return  # only some processes get here: a barrier would hang
    plan.insert_before.setdefault(before.stmt, []).append(cst.parse_statement("accelerator.wait_for_everyone()\n"))
    plan.change(CODE, before.stmt, "every process waits for the main process to finish the checkpoint before loading it")


def _checkpoint(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call) -> bool:
    """Convert one `torch.save`; True when it now saves from the main process only."""
    if not call.args:
        return False
    saved = call.args[0].value
    if type(saved) is cst.Name and roles.all_in(scope, saved.value, roles.models):
        plan.report(
            CODE,
            call,
            f"`torch.save({saved.value}, ...)` saves the whole module; after `prepare` that would pickle "
            f"the distributed wrapper: save `accelerator.unwrap_model({saved.value}).state_dict()` instead",
        )
        return False
    state_dicts = [c for c in _state_dict_calls(saved) if _model_root(roles, scope, c) is not None]
    if not state_dicts and type(saved) is cst.Name:
        # `weights = model.state_dict(); torch.save(weights, path)`: save once, from the main process.
        bound = [b.value for b in scope.bindings.get(saved.value, []) if b.value is not None]
        if any(_model_root(roles, scope, c) for v in bound for c in _state_dict_calls(v)):
            for value in bound:
                _unwrap_state_dicts(roles, plan, scope, value)
            plan.calls[call] = lambda updated: updated.with_changes(
                func=cst.Attribute(cst.Name("accelerator"), cst.Name("save"))
            )
            plan.use_accelerator(scope)
            plan.change(CODE, call, "checkpoint saved once, from the unwrapped model, by `accelerator.save`")
            return True
        return False
    if not state_dicts:
        return False
    _unwrap_state_dicts(roles, plan, scope, saved)
    plan.calls[call] = lambda updated: updated.with_changes(func=cst.Attribute(cst.Name("accelerator"), cst.Name("save")))
    plan.use_accelerator(scope)
    plan.change(CODE, call, "checkpoint saved once, from the unwrapped model, by `accelerator.save`")
    return True


def _unwrapped_state_dicts(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`model.state_dict()` / `model.load_state_dict(...)` go through `accelerator.unwrap_model`.

    A prepared model may be wrapped (DistributedDataParallel): its own state dict carries a
    `module.` prefix, and it would refuse a checkpoint saved by the single-device script. Only
    after the objects are prepared (or in another function), so `accelerator` exists.
    """
    prepared_at = roles.prepare_after.order if roles.prepare_after is not None else _existing_prepare(roles)
    for site in scope.method_calls:
        func = site.call.func
        assert type(func) is cst.Attribute and type(site.receiver) is cst.Name
        model = site.receiver.value
        if func.attr.value not in ("state_dict", "load_state_dict") or site.call in plan.calls:
            continue
        if not roles.all_in(scope, model, roles.models):
            continue
        if scope is roles.home and (site.where.order <= prepared_at or _rebuilt_after(scope, model, prepared_at, site)):
            continue
        plan.calls[site.call] = lambda updated, model=model: updated.with_changes(
            func=updated.func.with_changes(value=accelerator_call("unwrap_model", [cst.Arg(cst.Name(model))]))
        )
        plan.use_accelerator(scope)
        plan.change(CODE, site.call, f"`{model}.{func.attr.value}` on the unwrapped model")


def _rebuilt_after(scope: Scope, model: str, prepared_at: int, site: Site) -> bool:
    """The model was built anew after `prepare` (`model = Net()` for inference): not prepared, so
    nothing to unwrap."""
    before = [b for b in scope.bindings.get(model, []) if b.where.order < site.where.order]
    if not before:
        return False
    latest = max(before, key=lambda b: b.where.order)
    return (
        latest.where.order > prepared_at
        and type(latest.value) is cst.Call
        and model not in names_read(latest.value)
    )


def _existing_prepare(roles: Roles) -> int:
    """Document order of the home's own `accelerator.prepare(...)` (a script migrated before): a
    state dict loaded before it is the plain model's and stays as it is, so a second run is a no-op."""
    home = roles.home
    if home is None or not home.prepared:
        return 0
    orders = [
        site.where.order
        for site in home.method_calls
        if type(site.call.func) is cst.Attribute and site.call.func.attr.value == "prepare"
        and type(site.receiver) is cst.Name and site.receiver.value == "accelerator"
    ]
    return min(orders, default=0)


def _unwrap_state_dicts(roles: Roles, plan: EditPlan, scope: Scope, expr: cst.BaseExpression) -> None:
    for state_call in _state_dict_calls(expr):
        model = _model_root(roles, scope, state_call)
        if model is None:
            continue
        plan.calls[state_call] = lambda updated, model=model: updated.with_changes(
            func=cst.Attribute(
                accelerator_call("unwrap_model", [cst.Arg(cst.parse_expression(model))]), cst.Name("state_dict")
            )
        )


def _state_dict_calls(expr: cst.BaseExpression) -> list[cst.Call]:
    if type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Attribute and func.attr.value == "state_dict" and not expr.args:
            return [expr]
        return []
    if type(expr) is cst.IfExp:
        return [*_state_dict_calls(expr.body), *_state_dict_calls(expr.orelse)]
    if type(expr) is cst.Dict:
        found: list[cst.Call] = []
        for element in expr.elements:
            if type(element) is cst.DictElement:
                found.extend(_state_dict_calls(element.value))
        return found
    return []


def _model_root(roles: Roles, scope: Scope, state_call: cst.Call) -> str | None:
    """`m` for `m.state_dict()` / `m.module.state_dict()` when `m` is a prepared model."""
    assert type(state_call.func) is cst.Attribute
    owner = state_call.func.value
    if type(owner) is cst.Attribute and owner.attr.value == "module":
        owner = owner.value
    ref = reference(owner)
    if ref is not None and roles.all_in(scope, ref, roles.models):
        return ref
    return None


def _quiet_progress_bar(plan: EditPlan, scope: Scope, call: cst.Call) -> None:
    if any(arg.keyword is not None and arg.keyword.value == "disable" for arg in call.args):
        return
    if any(arg.star == "**" for arg in call.args):
        return
    disable = cst.Arg(
        keyword=cst.Name("disable"),
        value=cst.UnaryOperation(
            cst.Not(), cst.Attribute(cst.Name("accelerator"), cst.Name("is_local_main_process"))
        ),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )

    def add_disable(updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(args=[*args, disable])

    previous = plan.calls.get(call)
    plan.calls[call] = add_disable if previous is None else (lambda updated: add_disable(previous(updated)))
    plan.use_accelerator(scope)
    plan.change(CODE, call, "progress bar shown by the local main process only")


def _unreachable_method(roles: Roles, scope: Scope) -> str | None:
    """What a method is when its class never holds the accelerator ("an nn.Module": built before
    the Accelerator and never handed one; "a class of the script": the Accelerator is created at
    module level, and nothing threads it into the class), else None."""
    owner = scope.parent
    if not scope.is_method or owner is None or type(owner.node) is not cst.ClassDef:
        return None
    if roles.accelerator_scope in (roles.methods_of(scope) or []):
        return None
    bases = [roles.facts.aliases.qualify(base.value) or "" for base in owner.node.bases]
    if any(base.rsplit(".", 1)[-1] == "Module" for base in bases):
        return "an nn.Module"
    if roles.accelerator_scope is roles.facts.module_scope and not roles.needs_parameter(scope):
        return "a class of the script"
    return None


_RANK_NAME = re.compile(r"(^|_)rank$|^process_index$|^get_rank$", re.IGNORECASE)


def _says_its_rank(call: cst.Call) -> bool:
    """`print(f"rank {ddp_rank} sample {i}: {text}")`: a line each process prints about itself on
    purpose; from the main process only, the others' lines would be lost."""

    class Finder(Visitor):
        found = False

        def visit_Name(self, node: cst.Name) -> None:
            self.found = self.found or bool(_RANK_NAME.search(node.value))

    finder = Finder()
    for arg in call.args:
        walk(arg.value, finder)  # an attribute's name is a Name too: `args.rank`, `dist.get_rank()`
    return finder.found


def _rank_guarded(where: StmtRef) -> bool:
    """Inside an `if` whose test is a rank check (`if master_process:`, `if rank == 0:`)."""
    empty = cst.Module([])
    return any(type(outer.stmt) is cst.If and _RANK_TEST.search(empty.code_for_node(outer.stmt.test))
               for outer in where.path)


def _prints(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    sites = [site for site in scope.calls if site.callee == "print" and not scope.binds("print")]
    if not sites:
        return
    if roles.facts.patches_print:
        plan.report(
            CODE,
            sites[0].call,
            "the script patches `builtins.print` itself (a rank-0 print guard), so prints were left as "
            "they are; remove the patch and use `accelerator.print`",
        )
        return
    what = _unreachable_method(roles, scope)
    if what is not None:
        # Its methods cannot call `accelerator.print` (the safety check would refuse a
        # `self.accelerator` nobody sets): a print under the script's own rank check stays as it
        # is; any other is reported.
        unguarded = [s for s in sites if not _rank_guarded(s.where)]
        if unguarded:
            assert scope.parent is not None
            plan.report(CODE, unguarded[0].call, (
                f"`print` in `{scope.parent.name}.{scope.name}`, a method of {what}, which cannot reach "
                "the accelerator: it prints on every process; put it under the script's main-process check"))
        return
    sites = [s for s in sites if not _says_its_rank(s.call)]
    if not sites:
        return
    for site in sites:
        plan.calls[site.call] = lambda updated: updated.with_changes(
            func=cst.Attribute(cst.Name("accelerator"), cst.Name("print"))
        )
        plan.change(CODE, site.call, "`print` -> `accelerator.print` (main process only)")
    plan.use_accelerator(scope)
