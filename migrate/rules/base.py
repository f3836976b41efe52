"""What every rule module provides, and helpers they share for building statements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import libcst as cst

from migrate.analysis import Scope, StmtRef
from migrate.edits import EditPlan
from migrate.names import instance_attribute
from migrate.roles import Roles
from migrate.walk import walk

MAX_LINE = 88


@dataclass(frozen=True)
class Rule:
    """A rule as the registry and the CLI see it; built from the rule's module."""

    code: str
    name: str
    apply: Callable[[Roles, EditPlan], None]
    doc: str

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0]

    @classmethod
    def from_module(cls, module: ModuleType) -> "Rule":
        return cls(code=module.CODE, name=module.NAME, apply=module.apply, doc=module.__doc__ or "")


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def remove_statement(plan: EditPlan, stmt: cst.BaseStatement, value: cst.BaseExpression) -> bool:
    """Remove the statement whose value is `value` (`scaler = GradScaler()`, `sampler.set_epoch(e)`):
    its whole line, or on a line of several statements (`opt = SGD(...); scaler = GradScaler()`)
    that statement only. False (nothing removed) when no statement of such a line has that value."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) > 1:
        small = next((s for s in stmt.body if getattr(s, "value", None) is value), None)
        if small is None:
            return False
        plan.remove_small.add(small)
        return True
    plan.replace_stmt[stmt] = []
    return True


def assignment(targets: list[str], call: str, args: list[str], indent: int) -> cst.BaseStatement:
    """`a, b = call(a, b)`, wrapped black-style when it would pass MAX_LINE columns."""
    left = ", ".join(targets)
    one_line = f"{left} = {call}({', '.join(args)})"
    if indent + len(one_line) <= MAX_LINE:
        return statement(one_line + "\n")
    return statement(f"{left} = {call}(\n    {', '.join(args)}\n)\n")


def indent_of(scope: Scope, where: StmtRef | None) -> int:
    """Approximate indentation (columns) of a statement: 4 per enclosing block."""
    depth = len(where.path) if where is not None else 0
    parent = scope
    while parent.parent is not None:
        depth += 1
        parent = parent.parent
    return 4 * depth


class _NameCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_Name(self, node: cst.Name) -> None:
        if node.value not in self.names:
            self.names.append(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)  # `x.attr`: only `x` is a name read here
        return False


def names_read(node: cst.CSTNode) -> list[str]:
    """Names read in `node`, in first-seen order (attribute names excluded)."""
    collector = _NameCollector()
    walk(node, collector)
    return collector.names


def accelerator_call(method: str, args: list[cst.Arg]) -> cst.Call:
    """`accelerator.<method>(args...)` with fresh commas."""
    return cst.Call(
        func=cst.Attribute(cst.Name("accelerator"), cst.Name(method)),
        args=[a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args],
    )


def prepared_loaders(roles: Roles, plan: EditPlan) -> list[str]:
    """Training loaders that will be prepared: not those still sharded by a DistributedSampler, nor,
    under `--target accelerate` (whose `prepare` returns a non-DataLoader unchanged), those built by
    a function the migration cannot read or shown to be another iterator of batches."""
    return [
        n for n in roles.loaders
        if (n not in roles.rank_sampled or n in plan.unsharded_loaders)
        and not (plan.target == "accelerate" and (n in roles.unread_loaders or n in roles.iterable_loaders))
    ]


def early_prepare(roles: Roles, plan: EditPlan) -> tuple[StmtRef, list[str]] | None:
    """The statement before which models (and optimizers) are prepared in a call of their own, and
    their names (`Roles.early_prepare`): not under `--target accelerate`, where one call prepares all."""
    return None if plan.target == "accelerate" else roles.early_prepare


def placed_loaders(roles: Roles, plan: EditPlan) -> list[str]:
    """Prepared training loaders whose batches come out on the device: not those built by a function
    the migration cannot read, nor iterators shown not to be DataLoaders (prepared, a non-DataLoader
    comes back as it is on one process and yields its own batches, unmoved, on N: its batches keep
    their moves)."""
    return [n for n in prepared_loaders(roles, plan) if n not in roles.unread_loaders and n not in roles.iterable_loaders]


def reference(expr: cst.BaseExpression) -> str | None:
    """The name roles use for `expr`: `x` for a name, `self.x` for an instance attribute."""
    if isinstance(expr, cst.Name):
        return expr.value
    return instance_attribute(expr)


class _ReferenceCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[str] = []

    def _add(self, ref: str | None) -> None:
        if ref is not None and ref not in self.found:
            self.found.append(ref)

    def visit_Name(self, node: cst.Name) -> None:
        self._add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        ref = reference(node)
        if ref is not None:
            self._add(ref)
            return False
        walk(node.value, self)
        return False


def references_in(node: cst.CSTNode) -> list[str]:
    """Names and `self.x` attributes read in `node`, in first-seen order."""
    collector = _ReferenceCollector()
    walk(node, collector)
    return collector.found
