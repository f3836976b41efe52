"""A second name the training step uses for a training object, bound before `prepare`.

`net = model` (or `self.ddp_model = self.model` in a trainer's constructor, `step_opt = opt`,
`net, m = model, model`, a module-level `net = model`) written before the prepare point, then the
step calls `net(x)`, steps `step_opt.step()` or iterates the alias: `accelerator.prepare(...)`
rebinds `model`, not `net`, so the step would keep training the unprepared object (at N processes
no gradient all-reduce and the ranks drift apart; at one process the runtime returns the module
itself, so nothing shows). Found from use: an alias counts only when the training step calls it,
steps or zeroes it, or iterates it (in home's training loops, in a training call it is handed to,
or in the other methods of home's class); `model_without_ddp = model` used to build the optimizer
or to save stays the user's module (see `migrate.roles.unwrapped_alias`). A hand-wrapped alias
(`self.ddp_model = DDP(self.model)`) is `migrate.roles.placement`'s `model_aliases` instead.

Right output: the prepare call stays where it was and each such alias is bound again right after it
(`model, opt, loader = accelerator.prepare(model, opt, loader)` then `net = model`), so the step
names the prepared object. When the alias is handed on before the prepare point (passed to a call,
stored in a container or under another name), whatever holds it keeps the unprepared object: the
file is refused on the alias line (AM004), with the advice to name the object itself there.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, Scope, StmtRef
from migrate.names import instance_attribute

_STEPPING = frozenset({"step", "zero_grad"})


def origin(home: Scope, binding: Binding) -> str | None:
    """The name `binding` binds its target to when it is a plain alias: `net = model`,
    `self.ddp_model = self.model`, or one element of `net, m = model, model`."""
    value = binding.value
    if value is None:
        value = _tuple_element(home, binding)
    return _name(home, value)


def _name(home: Scope, value: cst.BaseExpression | None) -> str | None:
    if isinstance(value, cst.Name):
        return value.value
    if isinstance(value, cst.Attribute) and home.is_method and home.params:
        return instance_attribute(value, receiver=home.params[0])
    return None


def _tuple_element(home: Scope, binding: Binding) -> cst.BaseExpression | None:
    stmt = binding.where.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    if len(assign.targets) != 1:
        return None
    target, value = assign.targets[0].target, assign.value
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))):
        return None
    if len(target.elements) != len(value.elements):
        return None
    for left, right in zip(target.elements, value.elements):
        if isinstance(left, cst.StarredElement) or isinstance(right, cst.StarredElement):
            return None
        if _name(home, left.value) == binding.name:
            return right.value
    return None


def _matches(home: Scope, node: cst.BaseExpression, alias: str) -> bool:
    return _name(home, node) == alias if isinstance(node, (cst.Name, cst.Attribute)) else False


def used_by_step(node: cst.CSTNode, home: Scope, alias: str) -> bool:
    """`node` calls `alias(...)`, steps or zeroes it (`alias.step()`), or iterates it
    (`for b in alias`, `for i, b in enumerate(alias)`)."""
    found = False

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> bool:
            nonlocal found
            func = call.func
            if _matches(home, func, alias):
                found = True
            elif isinstance(func, cst.Attribute) and func.attr.value in _STEPPING and _matches(home, func.value, alias):
                found = True
            return not found

        def visit_For(self, loop: cst.For) -> bool:
            nonlocal found
            source = loop.iter
            if _matches(home, source, alias) or (
                isinstance(source, cst.Call) and any(_matches(home, a.value, alias) for a in source.args)
            ):
                found = True
            return not found

    node.visit(_Visitor())
    return found


def handed_on(stmts: list[cst.CSTNode], home: Scope, alias: str) -> cst.CSTNode | None:
    """The first statement of `stmts` that reads `alias` as an object (handed to a call, stored,
    bound to another name), not only through one of its attributes (`alias.parameters()`)."""
    for stmt in stmts:
        through: set[int] = set()
        found = False

        class _Visitor(cst.CSTVisitor):
            def visit_Attribute(self, node: cst.Attribute) -> bool:
                nonlocal found
                if id(node) not in through and _matches(home, node, alias):
                    found = True
                    return False
                through.add(id(node.value))
                return True

            def visit_Name(self, node: cst.Name) -> bool:
                nonlocal found
                if id(node) not in through and node.value == alias:
                    found = True
                return False

        stmt.visit(_Visitor())
        if found:
            return stmt
    return None


def between(home: Scope, first: StmtRef, last: StmtRef) -> list[cst.CSTNode] | None:
    """Home's own top-level statements after the one holding `first` up to the one holding `last`
    (None when they are not both in home's body, in that order)."""
    node = home.node
    body = node.body if isinstance(node, cst.Module) else getattr(getattr(node, "body", None), "body", None)
    if not isinstance(body, (list, tuple)):
        return None
    top = (*first.path, first)[0].stmt
    end = (*last.path, last)[0].stmt
    ids = [id(stmt) for stmt in body]
    if id(top) not in ids or id(end) not in ids or ids.index(id(top)) > ids.index(id(end)):
        return None
    return list(body[ids.index(id(top)) + 1 : ids.index(id(end)) + 1])
