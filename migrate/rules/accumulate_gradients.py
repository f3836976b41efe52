"""Wrap the body of each training loop in `with accelerator.accumulate(model):`.

What it does:
    The loop over a prepared training loader whose body calls `backward` gets its whole body
    wrapped in `with accelerator.accumulate(<models>):`, naming the prepared models the body uses.

Why:
    Inside `accumulate`, the Accelerator skips the gradient all-reduce and the optimizer step on
    micro-steps that only accumulate, and syncs at every N-th step and at the end of the loader.
    With `gradient_accumulation_steps=1` (the default) every step syncs, so the numbers are the
    same as without it; the block is what lets accumulation be switched on from the command line.

Example:
    for x, y in loader:                        for x, y in loader:
        loss = criterion(model(x), y)              with accelerator.accumulate(model):
        accelerator.backward(loss)                     loss = criterion(model(x), y)
        optimizer.step()                               accelerator.backward(loss)
                                                       optimizer.step()

Leaves alone:
    Loops already inside `accelerator.accumulate(...)`, loops over data that is not a prepared
    loader, and loops whose backward sits in a helper function (the helper's own loop, if any, is
    wrapped instead).

Fix safety:
    Safe: with one accumulation step the block changes nothing numerically.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Loop, Scope
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import accelerator_call, names_read

CODE = "AM005"
NAME = "accumulate-gradients"


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    done: set[int] = set()
    for scope in roles.facts.scopes:
        if not roles.can_reach(scope):
            continue
        for site in scope.backwards:
            loop = _training_loop(roles, scope, site.loops)
            if loop is None or id(loop) in done or loop.accumulating:
                continue
            done.add(id(loop))
            models = [n for n in names_read(loop.node.body) if roles.all_in(scope, n, roles.models)]
            plan.wrap_loop_body[loop.node] = accelerator_call("accumulate", [cst.Arg(cst.Name(m)) for m in models])
            plan.use_accelerator(scope)
            plan.change(CODE, loop.node, f"loop body wrapped in `accelerator.accumulate({', '.join(models)})`")


def _training_loop(roles: Roles, scope: Scope, loops: tuple[Loop, ...]) -> Loop | None:
    """The innermost enclosing loop that iterates a prepared training loader."""
    for loop in reversed(loops):
        if loop.source is not None and roles.all_in(scope, loop.source, roles.loaders):
            return loop
    return None


def wrapped_or_accumulating(plan: EditPlan, loops: tuple[Loop, ...]) -> bool:
    """True when a statement inside `loops` runs under `accelerator.accumulate` after the rewrite."""
    return any(loop.node in plan.wrap_loop_body or loop.accumulating for loop in loops)
