"""Prepare evaluation loaders and pass metric inputs through `accelerator.gather_for_metrics`.

What it does:
    For an evaluation loop (no backward) over a DataLoader built next to the model, finds the
    statements that accumulate a metric across batches (`correct += (pred == y).sum().item()`,
    `total += y.size(0)`, `losses.append(loss)`), and inserts, before the first of them,
    `pred, y = accelerator.gather_for_metrics((pred, y))` for the per-batch values they read. The
    loader is then prepared with the training objects and its batch moves go.

Why:
    A prepared loader gives each process a share of the evaluation set; the gathered values cover
    all of it, exactly once (the padding that evens out the last batch is dropped), so
    `correct / len(loader.dataset)` stays right on any number of processes.

Example:
    for data, target in test_loader:
        pred = model(data).argmax(dim=1)
        +pred, target = accelerator.gather_for_metrics((pred, target))
        correct += (pred == target).sum().item()

Leaves alone:
    Evaluation loops with no metric accumulation it recognises, or whose metric statements sit in
    nested blocks, and loaders iterated by several loops not all of which it can convert: those
    loaders stay unprepared and keep their `.to(device)`, so each process evaluates everything
    (correct, only redundant).

Fix safety:
    Safe on one process: gathering one process's values returns them unchanged.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Loop, Scope
from migrate.edits import EditPlan
from migrate.names import target_names
from migrate.roles import Roles
from migrate.rules.base import assignment, names_read
from migrate.walk import walk

CODE = "AM010"
NAME = "gather-eval-metrics"


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.home.prepared:
        return
    planned: dict[str, list[tuple[Scope, Loop, cst.BaseStatement, list[str]]]] = {}
    refused: set[str] = set()
    for scope, loop, loader in roles.eval_loops:
        if loop.gathers:
            continue
        found = _metric_inputs(roles, scope, loop) if roles.can_reach(scope) else None
        if found is None:
            refused.add(loader)
        else:
            planned.setdefault(loader, []).append((scope, loop, *found))
    for loader, entries in planned.items():
        if loader in refused:
            continue
        for scope, loop, first_metric, names in entries:
            stmt = assignment(names, "accelerator.gather_for_metrics", [_packed(names)], 0)
            plan.insert_before.setdefault(first_metric, []).append(stmt)
            plan.use_accelerator(scope)
            plan.change(CODE, first_metric, f"metric inputs {', '.join(names)} gathered across processes")
        plan.eval_loaders.append(loader)


def _packed(names: list[str]) -> str:
    return f"({', '.join(names)})" if len(names) > 1 else names[0]


def _metric_inputs(roles: Roles, scope: Scope, loop: Loop) -> tuple[cst.BaseStatement, list[str]] | None:
    """The first metric statement of the loop body and the per-batch names the metrics read.

    None when there is none, or when a metric runs the model itself (`preds.append(model(x))`):
    gathering its inputs would make every process evaluate the whole set.
    """
    body = loop.node.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    per_batch = set(loop.batch_names)
    first: cst.BaseStatement | None = None
    inputs: list[str] = []
    for stmt in body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            if first is None:
                per_batch.update(_bound_in(stmt))
            continue
        for small in stmt.body:
            read = _metric_reads(small)
            if read is None:
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and first is None:
                    targets = small.targets if isinstance(small, cst.Assign) else [small]
                    for target in targets:
                        per_batch.update(target_names(target.target))
                continue
            if any(roles.all_in(scope, n, roles.models) for n in _called_names(read)):
                return None
            used = [n for n in names_read(read) if n in per_batch and n not in inputs]
            if used:
                first = first or stmt
                inputs.extend(used)
    if first is None or not inputs:
        return None
    return first, inputs


def _metric_reads(small: cst.BaseSmallStatement) -> cst.CSTNode | None:
    """What a metric-accumulating statement reads: `acc += <expr>` or `acc.append(<expr>)`."""
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
        return small.value
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("append", "extend"):
            return small.value
    return None


def _bound_in(stmt: cst.BaseStatement) -> set[str]:
    names: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            names.update(target_names(node.target))

    walk(stmt, Visitor())
    return names


def _called_names(node: cst.CSTNode) -> list[str]:
    called: list[str] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Name):
                called.append(call.func.value)

    walk(node, Visitor())
    return called
