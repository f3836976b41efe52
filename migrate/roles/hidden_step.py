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
from migrate.roles.model_use import hidden_step_calls


def find_hidden_steps(roles: Roles) -> None:
    home = roles.home
    if home is None or not roles.optimizers or not roles.models or roles.accelerator_exists or roles.refused:
        return
    if any(scope.backwards for scope in roles.facts.scopes):
        return
    handed: list[tuple[Scope, CallSite, str]] = []
    for scope in roles.facts.scopes:
        for call in hidden_step_calls(roles, scope):
            optimizer = _handed_optimizer(roles, scope, call)
            if optimizer is None:
                continue
            handed.append((scope, call, optimizer))
            if _handed_loss(roles, scope, call):
                roles.hidden_steps.append((scope, call))
    if not roles.hidden_steps:
        if handed:
            _refuse(roles, *handed[0])
        return
    for _, call in roles.hidden_steps:
        for loop in call.loops:
            loop.has_backward = True
    roles._training_functions = training_functions(roles)


def _handed_optimizer(roles: Roles, scope: Scope, call: CallSite) -> str | None:
    home = roles.home
    for arg in call.call.args:
        if type(arg.value) is cst.Name:
            for origin in roles.origins(scope, arg.value.value) or ():
                if origin[0] is home and origin[1] in roles.optimizers:
                    return origin[1]
    return None


def _handed_loss(roles: Roles, scope: Scope, call: CallSite) -> bool:
    """An argument bound in `scope` from a value computed from a call of a model (followed through
    the names it is computed from), before the call."""
    models = {(roles.home, m) for m in roles.models}
    model_calls = [
        site for site in scope.calls
        if (origins := roles.origins(scope, site.callee)) and any(o in models for o in origins)
    ]
    if not model_calls:
        return False
    outputs = {name for site in model_calls for name in _bound_by(scope, site.call)}
    derived = set(outputs)
    for _ in range(4):  # `outputs = model(x)`, `loss = criterion(outputs, y)`, `loss = loss + ...`
        for name, bindings in scope.bindings.items():
            if name in derived:
                continue
            if any(b.value is not None and _reads(b.value, derived) for b in bindings):
                derived.add(name)
    return any(type(arg.value) is cst.Name and arg.value.value in derived for arg in call.call.args)


def _bound_by(scope: Scope, call: cst.Call) -> list[str]:
    return [name for name, bindings in scope.bindings.items() if any(_contains(b.value, call) for b in bindings)]


def _contains(value: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    if value is None:
        return False
    if value is node:
        return True
    return any(_contains(child, node) for child in value.children)


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
        f"`{code[:80]}` is handed the optimizer `{optimizer}` and no `.backward()` shows anywhere, but it is not "
        "handed a loss computed from the model in the same function, so the training step could not be found and "
        "the file was left as it is: compute the loss where this call is made and pass it, or call "
        f"`loss.backward()` and `{optimizer}.step()` in its place, then run the migration again",
        unconverted=True,
    ))
