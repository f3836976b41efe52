"""Replace `loss.backward()` with `accelerator.backward(loss)`.

What it does:
    Rewrites every `<expr>.backward(...)` call on a tensor to `accelerator.backward(<expr>, ...)`,
    whatever the receiver is (`loss`, `(a + b)`, `outputs.loss`). Positional arguments of
    `Tensor.backward` (gradient, retain_graph, create_graph) become keywords. A backward inside
    an optimizer closure (`def closure(): ...; loss.backward(); return loss` for LBFGS) is
    converted too.

Why:
    The Accelerator scales the loss for mixed precision and divides it for gradient accumulation;
    calling `backward` on the tensor directly bypasses both.

Example:
    loss.backward()              ->  accelerator.backward(loss)
    (l1 + l2).backward(retain_graph=True)
                                 ->  accelerator.backward(l1 + l2, retain_graph=True)

Leaves alone:
    `torch.autograd.backward(...)`, calls on the accelerator itself, and any backward in a
    function that cannot receive the accelerator (not called from this file, or called from a
    place that has none): those are reported instead, with the line to fix by hand. Also
    reported: a `.backward()` in a file that builds no optimizer (a library module: there is no
    place to create the Accelerator), and an optimizer built in a file with no `.backward()` at
    all (the step is hidden in another module, e.g. a trainer or a loss-scaler object).

Fix safety:
    Safe: `accelerator.backward(loss)` calls `loss.backward()` when no scaling applies.
"""

from __future__ import annotations

import libcst as cst

from migrate.edits import EditPlan
from migrate.roles import Roles

CODE = "AM003"
NAME = "replace-loss-backward"

_POSITIONAL = ("gradient", "retain_graph", "create_graph")


def apply(roles: Roles, plan: EditPlan) -> None:
    for scope in roles.facts.scopes:
        for site in scope.backwards:
            if site.call in plan.calls:
                continue  # already converted (mixed precision: `scaler.scale(loss).backward()`)
            if roles.home is None:
                plan.report(
                    CODE,
                    site.call,
                    "`.backward()` found but no optimizer is built in this file (a library module?), so "
                    "there is no place to create the Accelerator; create one where the optimizer is "
                    "built, prepare the training objects and call `accelerator.backward(loss)` here",
                )
            elif not roles.can_reach(scope):
                plan.report(
                    CODE,
                    site.call,
                    f"`.backward()` in `{scope.name}` cannot receive the accelerator (no caller in this file "
                    "passes it); add an `accelerator` parameter and call `accelerator.backward(loss)`",
                )
            else:
                plan.calls[site.call] = _to_accelerator_backward
                plan.use_accelerator(scope)
                plan.change(CODE, site.call, "`.backward()` -> `accelerator.backward(...)`")


def _to_accelerator_backward(call: cst.Call) -> cst.BaseExpression:
    assert isinstance(call.func, cst.Attribute)
    receiver = call.func.value.with_changes(lpar=[], rpar=[]) if _redundant_parens(call.func.value) else call.func.value
    args: list[cst.Arg] = [cst.Arg(receiver)]
    for index, arg in enumerate(call.args):
        if arg.keyword is None and index < len(_POSITIONAL) and not arg.star:
            arg = arg.with_changes(
                keyword=cst.Name(_POSITIONAL[index]),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
        args.append(arg)
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
    return cst.Call(
        func=cst.Attribute(cst.Name("accelerator"), cst.Name("backward")),
        args=args,
    )


def _redundant_parens(expr: cst.BaseExpression) -> bool:
    # `(a + b).backward()` -> `accelerator.backward(a + b)`: the parentheses were only for `.`.
    return bool(getattr(expr, "lpar", None)) and not isinstance(expr, (cst.Tuple, cst.GeneratorExp, cst.Yield))
