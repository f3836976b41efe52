"""A training step run by an object the migration cannot read, found from what the loop hands it.

`loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters())` (timm's
`NativeScaler`, an AMP scaler object of a module outside the run) runs `scaler.scale(loss).backward()`,
the clipping and `scaler.step(optimizer)` inside its `__call__`; no `.backward()` shows in the code
read. Where no `.backward()` shows anywhere, a call in a loop of an object (or a function) bound
by the code, not of this module or the unit, is the training step when it is handed the optimizer
(a name whose value is the optimizer `accelerator.prepare` takes) and the loss (a value the same
function computes from a call of a model). Its loop is a training loop, the functions that call it
train, and the call is kept as it is: with the model prepared (DistributedDataParallel on N
processes), the plain backward inside it all-reduces the gradients as the original's DDP did, and the
prepared optimizer steps as the bare one. What needs `accelerator.backward` cannot reach inside it:
`--mixed-precision` and `--strategy` are refused for such a file (its own AMP stays as it is).
A call handed the optimizer but no loss computed from a model is refused at that call."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import CallSite, Scope
from migrate.roles.entry import training_functions
from migrate.roles.model import BACKWARD, Finding, Roles
from migrate.roles.model_use import hidden_step_calls, unread_function


def find_hidden_steps(roles: Roles) -> None:
    home = roles.home
    if home is None or not roles.optimizers or not roles.models or roles.accelerator_exists or roles.refused:
        return
    if any(scope.backwards for scope in roles.facts.scopes):
        return
    handed: list[tuple[Scope, CallSite, str]] = []
    for scope in roles.facts.scopes:
        for call in (*hidden_step_calls(roles, scope), *_unread_function_calls(roles, scope)):
            optimizer = _handed_optimizer(roles, scope, call)
            if optimizer is None:
                continue
            handed.append((scope, call, optimizer))
            if _handed_loss(roles, scope, call, optimizer):
                roles.hidden_steps.append((scope, call))
    if not roles.hidden_steps:
        if handed:
            _refuse(roles, *handed[0])
        return
    for _, call in roles.hidden_steps:
        for loop in call.loops:
            loop.has_backward = True
    roles._training_functions = training_functions(roles)


def _unread_function_calls(roles: Roles, scope: Scope) -> list[CallSite]:
    """Calls in a loop of `scope` of a function of a module outside the run (`scaled_step(loss,
    optimizer)` imported from a package), as call sites named by their qualified name."""
    return [
        CallSite(call.qualified, call.call, call.where, call.loops)
        for call in scope.library_calls
        if call.loops and unread_function(roles, scope, call.call)
    ]


def _handed_optimizer(roles: Roles, scope: Scope, call: CallSite) -> str | None:
    home = roles.home
    for arg in call.call.args:
        if type(arg.value) is cst.Name:
            for origin in roles.origins(scope, arg.value.value) or ():
                if origin[0] is home and origin[1] in roles.optimizers:
                    return origin[1]
    return None


def _handed_loss(roles: Roles, scope: Scope, call: CallSite, optimizer: str) -> bool:
    """An argument other than the optimizer computed in `scope` from a forward of a model: a call of
    the model (`criterion(model(x), y)`) or a call handed it (`compute_loss(model, batch)`), directly
    or through the names bound from it (`outputs = model(x)`, `loss = criterion(outputs, y)`)."""
    models = {(roles.home, m) for m in roles.models}

    def is_model(name: str) -> bool:
        return any(o in models for o in roles.origins(scope, name) or ())

    def runs_model(node: cst.CSTNode) -> bool:
        if type(node) is cst.Call:
            if type(node.func) is cst.Name and is_model(node.func.value):
                return True
            if any(type(a.value) is cst.Name and is_model(a.value.value) for a in node.args):
                return True
        return any(runs_model(child) for child in node.children)

    derived: set[str] = set()
    for _ in range(5):  # `outputs = model(x)`, `loss = criterion(outputs, y)`, `loss = loss + ...`
        for name, bindings in scope.bindings.items():
            if name not in derived and any(
                b.value is not None and (runs_model(b.value) or _reads(b.value, derived)) for b in bindings
            ):
                derived.add(name)
    return any(
        not (type(arg.value) is cst.Name and arg.value.value == optimizer)
        and (runs_model(arg.value) or _reads(arg.value, derived))
        for arg in call.call.args
    )


def _reads(value: cst.CSTNode, names: set[str]) -> bool:
    if type(value) is cst.Name:
        return value.value in names
    return any(_reads(child, names) for child in value.children)


def _refuse(roles: Roles, scope: Scope, call: CallSite, optimizer: str) -> None:
    roles.refused = True
    code = " ".join(cst.Module([]).code_for_node(call.call).split())
    roles.findings.append(Finding(
        BACKWARD,
        call.where.stmt,
        f"`{code[:80]}` is handed the optimizer `{optimizer}` and no `.backward()` shows anywhere, but it is handed "
        "nothing computed from a forward of the model in the function that calls it (a loss), so the training step "
        "could not be found and the file was left as it is: call `loss.backward()` and "
        f"`{optimizer}.step()` where the loss is computed, then run the migration again",
        unconverted=True,
    ))


def refuse_for_options(roles: Roles, mixed_precision: str, strategy: str | None) -> None:
    """`--mixed-precision` or a sharding `--strategy` asked of a file whose step is hidden: the
    Accelerator's fp16 scaling needs `accelerator.backward`, and a sharded model needs its own
    clipping and step, neither of which reaches inside the object: the file is left as it is."""
    if not roles.hidden_steps or roles.refused:
        return
    asked = [f"`--mixed-precision {mixed_precision}`"] if mixed_precision != "no" else []
    if strategy not in (None, "ddp"):
        asked.append(f"`--strategy {strategy}`")
    if not asked:
        return
    call = roles.hidden_steps[0][1]
    code = " ".join(cst.Module([]).code_for_node(call.call.func).split())
    roles.refused = True
    roles.findings = [Finding(BACKWARD, call.where.stmt, (
        f"the training step runs inside `{code}(...)`, an object the migration cannot read that is handed the loss "
        f"and the optimizer, and {' and '.join(asked)} needs the backward, the clipping and the step to go through "
        "the Accelerator, which cannot reach inside it, so the file was left as it is: run without that option "
        "(the step is then kept as it is), or replace the call by `loss.backward()`, the clipping "
        "(`torch.nn.utils.clip_grad_norm_`) and `optimizer.step()` and run again"
    ), unconverted=True)]
