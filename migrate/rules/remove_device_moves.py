"""Remove `.to(device)` / `.cuda()` moves that the Accelerator now does.

What it does:
    Drops the device move of every prepared model (`model.to(device)`, `model.cuda()`,
    `model = Net().to(device)` -> `model = Net()`) and of the batches that come out of a prepared
    loader (`x, y = x.to(device), y.to(device)` disappears; `batch["x"].to(device)` becomes
    `batch["x"]`), including in helpers of this file that receive them as parameters. A move that
    also converts (`x.to(device, torch.float16)`) keeps its conversion.

Why:
    `accelerator.prepare` puts the model on the right device for each process, and a prepared
    loader yields batches already on it; a hard-coded move would be redundant at best.

Example:
    model = Net().to(device)           ->  model = Net()
    criterion = nn.CrossEntropyLoss().cuda()  ->  criterion = nn.CrossEntropyLoss().to(accelerator.device)
    for x, y in loader:                    for x, y in loader:
        x, y = x.to(device), y.to(device)      (removed)

    Any other `.cuda(...)` (a criterion, a fresh tensor, `x.cuda(args.gpu, non_blocking=True)`)
    becomes `.to(accelerator.device, ...)`: the current CUDA device, or a GPU index read from the
    command line, is this process's device under the Accelerator, and the script runs without CUDA.

Leaves alone:
    Moves of freshly created tensors (`torch.zeros(3).to(device)`): `device` is now
    `accelerator.device`, so they stay correct. Moves of evaluation batches, of frozen models and
    of anything whose device is not known to be the chosen device.

Fix safety:
    Safe: a removed move only ever targeted the device the Accelerator uses.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Move, Scope
from migrate.edits import EditPlan
from migrate.names import root_name
from migrate.roles import Roles, kept_as_attribute
from migrate.rules.base import prepared_loaders, reference

CODE = "AM002"
NAME = "remove-device-moves"


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not (roles.models or roles.loaders or plan.eval_loaders):
        return
    for scope in roles.facts.scopes:
        for move in scope.moves:
            if move.device_arg is not None and not roles.is_device(scope, move.device_arg):
                continue
            what = _moved_object(roles, scope, move, prepared_loaders(roles, plan), plan.eval_loaders)
            if what is None:
                _retarget_cuda(roles, plan, scope, move)
                continue
            kept = [i for i, arg in enumerate(move.call.args) if arg in move.kept_args]
            plan.calls[move.call] = lambda call, kept=kept: _strip(call, kept)
            plan.drop_if_trivial.add(move.where.stmt)
            plan.change(CODE, move.call, f"removed device move of {what}")


def _moved_object(
    roles: Roles, scope: Scope, move: Move, plan_loaders: list[str], plan_eval_loaders: list[str]
) -> str | None:
    """'model `m`' / 'batch `x`' when the move is one the Accelerator now makes, else None."""
    receiver = move.receiver
    ref = reference(receiver)
    if ref is not None and scope is roles.home and scope.is_method:
        # `self.model = model.to(device)` in a constructor that prepares `self.model`.
        ref = kept_as_attribute(scope, ref) or ref
    if ref is not None and roles.all_in(scope, ref, roles.models):
        # After `prepare` the model is on its device; a later move in the same function undoes
        # something the script did in between (`model.cpu()` to save a checkpoint): keep it.
        prepared_at = roles.prepare_after.order if roles.prepare_after is not None else 0
        if scope is roles.home and move.where.order > prepared_at:
            return None
        return f"model `{ref}`"
    if isinstance(receiver, cst.Call) and scope is roles.home:
        target = _assigned_name(roles, move)
        if target is not None and target in roles.models:
            return f"model `{target}`"
    root = root_name(receiver)
    if root is None:
        return None
    loaders = [*plan_loaders, *plan_eval_loaders]
    for loop in move.loops:
        if root in loop.batch_names and loop.source is not None and roles.all_in(scope, loop.source, loaders):
            return f"batch `{root}`"
    if root in scope.params and _batch_parameter(roles, scope, root, loaders):
        return f"batch `{root}`"
    return None


def _retarget_cuda(roles: Roles, plan: EditPlan, scope: Scope, move: Move) -> None:
    """`criterion.cuda()`, `torch.zeros(3).cuda()`, `x.cuda(args.gpu, non_blocking=True)` that stay:
    `.to(accelerator.device, ...)`, which is this process's GPU and also runs without CUDA."""
    func = move.call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda") or not roles.can_reach(scope):
        return
    if scope is roles.accelerator_scope and not _after_creation(roles, move):
        return
    device = cst.Attribute(cst.Name("accelerator"), cst.Name("device"))
    plan.calls[move.call] = lambda call, device=device: _to_device(call, device)
    plan.use_accelerator(scope)
    plan.change(CODE, move.call, "`.cuda()` -> `.to(accelerator.device)`: this process's device")


def _after_creation(roles: Roles, move: Move) -> bool:
    """The move runs after the Accelerator is created in its own scope (at the device choice, or at
    the top of the scope when there is none)."""
    if roles.device_binding is None:
        return roles.create_before is not None
    return move.where.order > roles.device_binding.where.order


def _to_device(call: cst.Call, device: cst.BaseExpression) -> cst.Call:
    assert isinstance(call.func, cst.Attribute)
    kept = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in call.args if a.keyword is not None]
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(device), *kept])


def _batch_parameter(roles: Roles, scope: Scope, name: str, loaders: list[str]) -> bool:
    """A parameter every caller fills with batch data of a prepared loader (`self.train_step(x, y)`
    inside `for x, y in self.loader`)."""
    index = scope.params.index(name) - (1 if scope.is_method else 0)
    callers = roles.call_sites(scope)
    if not callers or index < 0:
        return False
    for caller, call in callers:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        keyword = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        arg = positional[index].value if index < len(positional) else keyword.get(name)
        if not isinstance(arg, cst.Name):
            return False
        loops = [site.loops for site in caller.calls if site.call is call]
        if not loops or not any(
            arg.value in loop.batch_names and loop.source is not None and roles.all_in(caller, loop.source, loaders)
            for loop in loops[0]
        ):
            return False
    return True


_WRAPPERS = frozenset({
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
    # the defining modules, as `from torch.nn.parallel.distributed import DistributedDataParallel` names them
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.nn.parallel.data_parallel.DataParallel",
})


def _assigned_name(roles: Roles, move: Move) -> str | None:
    """`model = Net().to(device)`, or `model = DDP(Net().to(device), ...)` (AM007 unwraps it): `model`."""
    stmt = move.where.stmt
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    for small in stmt.body:
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
            continue
        value = small.value
        if (
            isinstance(value, cst.Call)
            and value.args
            and value.args[0].value is move.call
            and roles.facts.aliases.qualify(value.func) in _WRAPPERS
        ):
            value = move.call
        if value is move.call:
            return reference(small.targets[0].target)
    return None


def _strip(call: cst.Call, kept: list[int]) -> cst.BaseExpression:
    assert isinstance(call.func, cst.Attribute)
    if not kept:
        return call.func.value
    args = [call.args[i] for i in kept]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    func = call.func if call.func.attr.value == "to" else call.func.with_changes(attr=cst.Name("to"))
    return call.with_changes(func=func, args=args)
