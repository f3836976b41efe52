"""Clip gradients through the Accelerator, on sync steps only.

What it does:
    `torch.nn.utils.clip_grad_norm_(...)` / `clip_grad_value_(...)` become
    `accelerator.clip_grad_norm_(...)` / `accelerator.clip_grad_value_(...)` (same arguments).
    Inside an `accelerator.accumulate(...)` block a clipping statement is guarded by
    `if accelerator.sync_gradients:` so it runs once per optimizer step, on the full gradients.

Why:
    Under mixed precision the gradients must be unscaled before they are clipped; the
    Accelerator's clipping does it. Clipping a partially accumulated gradient would change the
    result of accumulation.

Example:
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ->
    if accelerator.sync_gradients:
        accelerator.clip_grad_norm_(model.parameters(), 1.0)

Leaves alone:
    Clipping in functions that cannot receive the accelerator (reported), and a clipping call
    whose result is used (`norm = clip_grad_norm_(...)`) is converted but not guarded, so `norm`
    stays defined.

Fix safety:
    Safe.
"""

from __future__ import annotations

import libcst as cst

from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.accumulate_gradients import wrapped_or_accumulating

CODE = "AM008"
NAME = "clip-gradients"

_CLIPPERS = {
    "torch.nn.utils.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_": "clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_value_": "clip_grad_value_",
}


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            method = _CLIPPERS.get(call.qualified)
            if method is None:
                continue
            if not roles.can_reach(scope):
                plan.report(CODE, call.call, f"gradient clipping in `{scope.name}` cannot reach the accelerator; "
                            f"call `accelerator.{method}(...)` there yourself", unconverted=True)
                continue
            stmt = call.where.stmt
            standalone = (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)
                and stmt.body[0].value is call.call
            )
            new_call = call.call.with_changes(func=_accelerator_method(method))
            parent = call.where.path[-1].stmt if call.where.path else None
            already_gated = isinstance(parent, cst.If) and parent in plan.sync_ifs
            if standalone and wrapped_or_accumulating(plan, call.loops) and not already_gated:
                assert isinstance(stmt, cst.SimpleStatementLine)
                guarded = cst.If(
                    test=cst.Attribute(cst.Name("accelerator"), cst.Name("sync_gradients")),
                    body=cst.IndentedBlock(body=[stmt.with_changes(body=[cst.Expr(new_call)], leading_lines=[])]),
                    leading_lines=stmt.leading_lines,
                )
                plan.replace_stmt[stmt] = [guarded]
            else:
                plan.calls[call.call] = lambda updated, method=method: updated.with_changes(func=_accelerator_method(method))
            plan.use_accelerator(scope)
            plan.change(CODE, call.call, f"clipping through `accelerator.{method}`")


def _accelerator_method(method: str) -> cst.Attribute:
    return cst.Attribute(cst.Name("accelerator"), cst.Name(method))
