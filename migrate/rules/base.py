"""What every rule module provides, and helpers they share for building statements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import libcst as cst

from migrate.analysis import Loop, Scope, StmtRef
from migrate.edits import EditPlan
from migrate.names import call_argument, instance_attribute
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


def prepared_at(roles: Roles, loader: str, early: tuple[StmtRef, list[str]] | None) -> int | None:
    """The order, in home, of the statement after which `loader` is prepared: the script's own
    `accelerator.prepare(..., loader, ...)` (a migrated file run again), else where it goes."""
    assert roles.home is not None
    written = [
        site.where.order for site in roles.home.method_calls
        if isinstance(site.call.func, cst.Attribute) and site.call.func.attr.value == "prepare"
        and any(isinstance(arg.value, cst.Name) and arg.value.value == loader for arg in site.call.args)
    ]
    if written:
        return min(written) - 1  # a call in the prepare statement's own line runs after it
    if early is not None and loader in early[1]:
        return early[0].order
    return roles.prepare_after.order if roles.prepare_after is not None else None


def loader_calls(
    roles: Roles, scope: Scope, param: str, early: tuple[StmtRef, list[str]] | None,
    _seen: frozenset[int] = frozenset(),
) -> tuple[list[cst.Call], bool]:
    """How the function `scope` gets the loader in its parameter `param`: the calls in home that
    hand it one (directly, or through functions that pass their own parameter on) at or before the
    point where that loader is prepared (teacher outputs computed over the loader before the
    student is built, a baseline evaluation before the optimizer exists: they iterate the
    unprepared loader, whole on every process, its batches on the CPU), and whether any call hands
    it one after that point (or in a way not known to be before it)."""
    index = scope.params.index(param) - (1 if scope.is_method else 0)
    before: list[cst.Call] = []
    after = False
    for caller, call in roles.call_sites(scope):
        arg = call_argument(call, index, param) if index >= 0 else None
        if (
            isinstance(arg, cst.Call) and isinstance(arg.func, cst.Attribute)
            and arg.func.attr.value == "prepare_data_loader" and len(arg.args) == 1
        ):
            arg = arg.args[0].value  # a sharded copy made there (AM010), on a second run: the same call
        if caller is roles.home and isinstance(arg, cst.Name):
            at = prepared_at(roles, arg.value, early)
            order = next((site.where.order for site in caller.calls if site.call is call), None)
            if order is not None and at is not None and order <= at:
                before.append(call)
            else:
                after = True
        elif isinstance(arg, cst.Name) and arg.value in caller.params and id(caller) not in _seen:
            outer, later = loader_calls(roles, caller, arg.value, early, _seen | {id(scope)})
            before.extend(outer)
            after = after or later or not outer
        else:
            after = True
    return before, after


def runs_before_prepare(roles: Roles, scope: Scope, loop: Loop, early: tuple[StmtRef, list[str]] | None) -> bool:
    """The loop over a loader of home runs only before that loader is prepared: a loop of home
    placed above the prepare point (and not around it), or a loop over a function's loader
    parameter whose every call hands it the loader before that point (`loader_calls`)."""
    if loop.source is None or roles.home is None:
        return False
    if scope is roles.home:
        at = prepared_at(roles, loop.source, early)
        around = roles.prepare_after is not None and any(ref.stmt is loop.node for ref in roles.prepare_after.path)
        return at is not None and loop.where.order <= at and not around
    if loop.source in scope.params:
        before, after = loader_calls(roles, scope, loop.source, early)
        return bool(before) and not after
    return False


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
