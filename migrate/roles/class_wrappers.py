"""A prepared model wrapped again by hand inside a trainer class: `self.model = DDP(self.model, ...)`.

The DDP tutorial's shape: `main` builds the model (`dataset, model, optimizer = load_train_objs()`)
and hands it to `Trainer(model, ...)`, whose constructor moves it, maybe loads a snapshot into it,
then wraps it: `self.model = DDP(self.model, device_ids=[gpu])`. `accelerator.prepare` in `main`
wraps the model already, so this wrapper must go, and with it everything that relied on it:

- `self.model.module` anywhere in the class (`self.model.module.state_dict()` for the snapshot,
  `ema.update(self.model.module)`) reads the bare module: `accelerator.unwrap_model(self.model)`;
- reads of `self.model` that ran before the wrap (in the constructor above it, and in methods only
  it calls from there: `self._load_snapshot(path)` doing `self.model.load_state_dict(...)`) used the
  bare module too: they become `accelerator.unwrap_model(self.model)` (the prepared model's own
  `state_dict` keys carry DDP's `module.` prefix).

`class_wrapper` says what to rewrite, or why it cannot (the wrapper is then refused with the line):
the wrap must be a statement of its own in the constructor, outside loops and branches, binding the
same attribute the class trains; the attribute bound nowhere else after it; the wrapped object not
read under another name (`m = self.model` then `m.module`), and a method called before the wrap not
called again after it."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from migrate.analysis import Scope
from migrate.names import instance_attribute
from migrate.walk import contains, walk


@dataclass(eq=False)
class ClassWrapper:
    """`self.model = DDP(self.model, ...)` in `constructor`, and the reads it changes."""

    constructor: Scope
    stmt: cst.BaseStatement  # the wrapping statement: removed
    call: cst.Call
    attribute: str  # "self.model"
    # `self.model.module` -> `accelerator.unwrap_model(self.model)`, by method
    module_reads: list[tuple[Scope, cst.Attribute]] = field(default_factory=list)
    # `self.model` read before the wrap -> `accelerator.unwrap_model(self.model)`, by method
    bare_reads: list[tuple[Scope, cst.Attribute]] = field(default_factory=list)


def class_wrapper(methods: list[Scope], constructor: Scope, call: cst.Call) -> ClassWrapper | str:
    """The wrapper `call` in `constructor` as a `ClassWrapper`, or the reason it cannot go."""
    node = constructor.node
    if not (isinstance(node, cst.FunctionDef) and isinstance(node.body, cst.IndentedBlock) and constructor.params):
        return "the wrapper is not in the class's constructor"
    receiver = constructor.params[0]
    body = list(node.body.body)
    stmt = next((s for s in body if _assigned_call(s) is call), None)
    if stmt is None:
        return "the wrapper is not a statement of its own in the constructor (outside loops and branches)"
    target = _assign(stmt).targets[0].target
    attribute = instance_attribute(target, receiver=receiver)
    if attribute is None:
        return "the wrapper is not bound to an attribute of the instance"
    if not call.args:
        return "the wrapper is given no model"
    inner = call.args[0].value
    inner_attribute = instance_attribute(inner, receiver=receiver)
    if not (inner_attribute == attribute or (inner_attribute is None and isinstance(inner, cst.Name))):
        # `self.ddp_model = DDP(self.model)`: `self.model` stayed the bare module the class reads
        return f"it binds `{attribute}`, another attribute than the model it wraps"
    position = body.index(stmt)
    by_name = {m.name: m for m in methods}
    before = _called_methods(body[:position], receiver, by_name)
    after = _called_methods(body[position + 1:], receiver, by_name)
    for method in methods:
        if method is constructor:
            continue
        if method not in before:
            after |= _called_methods(_body(method), method.params[0] if method.params else receiver, by_name)
    if before & after:
        name = sorted(m.name for m in before & after)[0]
        return f"`{name}` runs both before the wrapper (on the bare model) and after it (on the wrapped one)"
    found = ClassWrapper(constructor, stmt, call, attribute)
    for method in methods:
        own_receiver = method.params[0] if method.params else receiver
        reads = _reads(_body(method), own_receiver, attribute)
        for read, parent_attr, assigned in reads:
            if method is constructor and contains(stmt, read):
                continue
            if assigned:
                if method is not constructor or _position(body, read) > position:
                    return f"`{attribute}` is bound again in `{method.name}`"
                continue
            if parent_attr is not None and parent_attr.attr.value == "module":
                found.module_reads.append((method, parent_attr))
            elif method in before or (method is constructor and _position(body, read) < position):
                found.bare_reads.append((method, read))
    return found


def _assign(stmt: cst.BaseStatement) -> cst.Assign:
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
    return stmt.body[0]


def _assigned_call(stmt: cst.BaseStatement) -> cst.Call | None:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call):
        return small.value
    return None


def _body(method: Scope) -> list[cst.BaseStatement]:
    node = method.node
    return list(node.body.body) if isinstance(node, cst.FunctionDef) and isinstance(node.body, cst.IndentedBlock) else []


def _position(body: list[cst.BaseStatement], node: cst.CSTNode) -> int:
    """Index of the statement of `body` holding `node`."""
    return next(i for i, s in enumerate(body) if contains(s, node))



def _called_methods(stmts: list[cst.BaseStatement], receiver: str, by_name: dict[str, Scope]) -> set[Scope]:
    """Methods of the class `stmts` call as `self.name(...)`, and those they call, transitively."""
    found: set[Scope] = set()
    pending = list(stmts)

    class Calls(cst.CSTVisitor):
        def __init__(self, receiver: str) -> None:
            self.receiver = receiver

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == self.receiver:
                method = by_name.get(func.attr.value)
                if method is not None and method not in found:
                    found.add(method)
                    inner = method.params[0] if method.params else self.receiver
                    for stmt in _body(method):
                        walk(stmt, Calls(inner))

    for stmt in pending:
        walk(stmt, Calls(receiver))
    return found


def _reads(
    stmts: list[cst.BaseStatement], receiver: str, attribute: str
) -> list[tuple[cst.Attribute, cst.Attribute | None, bool]]:
    """Every `self.model` in `stmts`: the node, the attribute access on it (`.module`), and whether
    it is an assignment target."""
    found: list[tuple[cst.Attribute, cst.Attribute | None, bool]] = []

    class Reads(cst.CSTVisitor):
        def __init__(self) -> None:
            self.targets: set[int] = set()
            self.parents: dict[int, cst.Attribute] = {}

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            self.targets.add(id(node.target))

        def visit_Attribute(self, node: cst.Attribute) -> None:
            self.parents[id(node.value)] = node
            if instance_attribute(node, receiver=receiver) == attribute:
                found.append((node, self.parents.get(id(node)), id(node) in self.targets))

    for stmt in stmts:
        walk(stmt, Reads())
    return found

