"""One read-only pass over a module that records the raw facts the rules work from.

The pass keeps, per scope (the module, each function, each class body), the names it binds, the
loops it runs and what they iterate, the device moves, `.backward()` and `.step()` calls, and the
calls to other functions of the same module. It decides nothing: `migrate/roles/` turns these
facts into roles (which names are the model, the optimizer, the training loader...).
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Union

import libcst as cst

from migrate.names import ImportAliases, dotted_name, instance_attribute, root_name, target_names
from migrate.walk import NOT_NODES, Visitor, child_getter, own_method, walk

ACCELERATOR_CLASSES = frozenset({"runtime.Accelerator", "accelerate.Accelerator"})
# Wrappers a training loop puts around its loader: `for i, batch in enumerate(tqdm(loader))`.
LOOP_WRAPPERS = frozenset({"enumerate", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "trange"})
# Methods that yield the items of their first argument: a metric logger's
# `for batch in metric_logger.log_every(loader, print_freq, header)` (research repositories' utils.py).
LOOP_WRAPPER_METHODS = frozenset({"log_every"})

Block = Union[cst.Module, cst.IndentedBlock]
ScopeNode = Union[cst.Module, cst.FunctionDef, cst.ClassDef]


@dataclass(eq=False)
class StmtRef:
    """Where a statement sits: its block, its document order, and its enclosing statements."""

    stmt: cst.BaseStatement
    block: Block
    order: int
    path: tuple["StmtRef", ...]
    in_loop: bool


@dataclass(eq=False)
class Binding:
    """`name = value` (value is None when the target is part of a tuple or a for target)."""

    name: str
    value: cst.BaseExpression | None
    where: StmtRef
    is_loop_target: bool = False


@dataclass(eq=False)
class Loop:
    """A `for` loop, the name it iterates (after unwrapping enumerate/tqdm) and its batch names."""

    node: cst.For
    source: str | None
    batch_names: set[str]
    where: StmtRef
    has_backward: bool = False
    callees: set[str] = field(default_factory=set)
    accumulating: bool = False  # body is already `with accelerator.accumulate(...)`
    gathers: bool = False  # calls `accelerator.gather_for_metrics` (already migrated)
    scope: Scope | None = field(default=None, repr=False)  # the function (or module) the loop runs in


@dataclass(eq=False)
class Move:
    """`receiver.to(...)` or `receiver.cuda(...)`: a device move when its device resolves to one."""

    call: cst.Call
    receiver: cst.BaseExpression
    device_arg: cst.BaseExpression | None  # None for `.cuda()`
    kept_args: tuple[cst.Arg, ...]  # what stays once the device (and non_blocking) is dropped
    where: StmtRef
    loops: tuple[Loop, ...]


@dataclass(eq=False)
class CallSite:
    """A call of a plain name, `f(a, b=c)`, that may target a function of this module."""

    callee: str
    call: cst.Call
    where: StmtRef
    loops: tuple[Loop, ...]


@dataclass(eq=False)
class Site:
    """A call worth rewriting (`x.backward()`) or classifying (`sched.step()`), with context."""

    call: cst.Call
    receiver: cst.BaseExpression
    where: StmtRef
    loops: tuple[Loop, ...]


@dataclass(eq=False)
class LibraryCall:
    """A call of an imported function, by qualified name (`torch.save`, `tqdm.tqdm`, ...)."""

    qualified: str
    call: cst.Call
    where: StmtRef
    loops: tuple[Loop, ...]


@dataclass(eq=False)
class DeviceBinding:
    """A statement that chooses the device: `device = torch.device(...)` or an if/else doing so."""

    name: str
    where: StmtRef
    value: cst.BaseExpression | None


@dataclass(eq=False)
class Scope:
    node: ScopeNode
    name: str
    parent: "Scope | None"
    params: list[str] = field(default_factory=list)
    simple_signature: bool = True  # only plain positional parameters without defaults
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    loops: list[Loop] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    backwards: list[Site] = field(default_factory=list)
    steps: list[Site] = field(default_factory=list)
    calls: list[CallSite] = field(default_factory=list)
    library_calls: list[LibraryCall] = field(default_factory=list)
    method_calls: list[Site] = field(default_factory=list)  # `name.method(...)` on a plain name
    # `name.member.method(...)` on a member of a plain name other than `self` (`run.config.update(...)`)
    member_calls: list[Site] = field(default_factory=list)
    module_accesses: list[tuple[cst.Attribute, StmtRef]] = field(default_factory=list)  # `name.module`
    zero_comparisons: list[tuple[cst.Comparison, cst.BaseExpression, bool]] = field(default_factory=list)
    returns: list[cst.BaseExpression] = field(default_factory=list)  # values of `return` statements
    devices: list[DeviceBinding] = field(default_factory=list)
    accelerators: list[Binding] = field(default_factory=list)
    prepared: set[str] = field(default_factory=set)
    local_functions: dict[str, Scope] = field(default_factory=dict)  # plain functions defined in this function

    @property
    def is_function(self) -> bool:
        return type(self.node) is cst.FunctionDef

    @property
    def is_method(self) -> bool:
        return self.parent is not None and type(self.parent.node) is cst.ClassDef

    def binds(self, name: str) -> bool:
        return name in self.bindings or name in self.params

    @property
    def qualname(self) -> str:
        """`train`, `Trainer.fit`, `main.closure`: the dotted path a message names."""
        names = []
        scope: Scope | None = self
        while scope is not None and scope.parent is not None:
            names.append(scope.name)
            scope = scope.parent
        return ".".join(reversed(names)) or self.name


@dataclass(eq=False)
class Facts:
    module: cst.Module
    aliases: ImportAliases
    scopes: list[Scope]
    functions: dict[str, Scope]  # module-level plain (non-method) functions by name
    classes: dict[str, Scope]  # module-level classes by name
    module_scope: Scope
    import_block_end: StmtRef | None  # first module statement after the leading imports
    patches_print: bool = False  # assigns `builtins.print` (a rank-0 print patch)
    text: str | None = None  # the module's source when the caller has it (spares a code-generation pass)
    # roles found a hidden training step (`roles/hidden_step.py`), which marks the loops that run it
    # as training ones: these facts are no longer what `analyze` gives, so no other run may reuse them
    stepped: bool = False

    # Calls are resolved as Python resolves the name where the call runs, never by the name alone:
    # two functions may share a name (a nested `main` beside the module's, a `closure` in each of
    # two functions), and the one a call reaches depends on where the call is.

    def resolve(self, callee: str, at: Scope) -> Scope | None:
        """The function a call of `callee` (a plain name, or `self.name`) made in `at` runs: the
        nearest enclosing function defining it (class bodies are skipped, as Python skips them),
        then the module's functions (with the names a cross-module view joins in); None when a
        parameter or variable shadows the name on the way, or nothing defines it."""
        if callee.startswith("self."):
            return self._method(callee.removeprefix("self."), at)
        level: Scope | None = at
        while level is not None and level.parent is not None:
            if level.is_function:
                found = level.local_functions.get(callee)
                if found is not None:
                    return found
                if level.binds(callee):
                    return None
            level = level.parent
        return self.functions.get(callee)

    def _method(self, name: str, at: Scope) -> Scope | None:
        level: Scope | None = at
        while level is not None and not level.is_method:
            level = level.parent  # a closure inside a method calls `self.x` of that method's class
        owner = level.parent if level is not None else None
        if owner is None:
            return None
        return next((s for s in self.scopes if s.parent is owner and s.is_function and s.name == name), None)

    def function_called(self, call: cst.Call) -> Scope | None:
        """The function of this module (or of the cross-module view) that `call` runs."""
        found = self._call_sites.get(id(call))
        return self.resolve(found[0].callee, found[1]) if found is not None else None

    def call_site(self, call: cst.Call) -> CallSite | None:
        """The recorded call site of `call` (a call of a plain name), with its statement."""
        found = self._call_sites.get(id(call))
        return found[0] if found is not None else None

    @cached_property
    def _call_sites(self) -> dict[int, tuple[CallSite, Scope]]:
        return {id(site.call): (site, scope) for scope in self.scopes for site in scope.calls}

    def plain_functions(self) -> list[Scope]:
        """Every function that is not a method, nested ones included."""
        return [s for s in self.scopes if s.is_function and not s.is_method]


@dataclass(eq=False)
class _Frame:
    scope: Scope
    stmts: list[StmtRef] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)


_OTHER, _BLOCK, _STATEMENT = 0, 1, 2


def _kind(node_type: type) -> int:
    """Blocks, statements, or other nodes."""
    if issubclass(node_type, (cst.Module, cst.IndentedBlock)):
        return _BLOCK
    if issubclass(node_type, cst.BaseStatement):
        return _STATEMENT
    return _OTHER


def _own(node_type: type, prefix: str) -> Callable[..., object] | None:
    """The collector's `visit_<Type>` or `leave_<Type>`; None for libcst's no-op default."""
    return own_method(_Collector, prefix + node_type.__name__)


# Field values that are not nodes.
# Node types without node children, that the collector never looks at: `collect` skips them.
_LEAVES = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString})


class _Collector(Visitor):
    def __init__(self, module: cst.Module) -> None:
        self.aliases = ImportAliases()
        self.module_scope = Scope(node=module, name="<module>", parent=None)
        self.scopes: list[Scope] = [self.module_scope]
        self.frames: list[_Frame] = [_Frame(self.module_scope)]
        self.blocks: list[Block] = []
        self.order = 0
        self.import_block_end: StmtRef | None = None
        self.leading_imports = True
        self._elifs: set[int] = set()
        self.patches_print = False

    # -- structure -------------------------------------------------------------------------

    @property
    def frame(self) -> _Frame:
        return self.frames[-1]

    # Per node type: its kind, `visit_<Type>` and `leave_<Type>` (None where the collector keeps
    # libcst's no-op) and its child getter (isinstance against libcst's ABCs and the method
    # lookups are too slow to repeat for every node).
    _dispatch: dict[type, tuple[int, Callable[..., object] | None, Callable[..., object] | None,
                                Callable[[cst.CSTNode], tuple[object, ...]]]] = {}

    def _entry(self, node_type: type) -> tuple[int, Callable[..., object] | None, Callable[..., object] | None,
                                               Callable[[cst.CSTNode], tuple[object, ...]]]:
        entry = self._dispatch.get(node_type)
        if entry is None:
            entry = self._dispatch[node_type] = (
                _kind(node_type), _own(node_type, "visit_"), _own(node_type, "leave_"), child_getter(node_type)
            )
        return entry

    def collect(self, node: cst.CSTNode) -> None:
        """`walk(node, self)`, in one call per node: the commonest nodes (no kind, no method of
        the collector) cost a table lookup, and their leaf children (names, numbers, strings)
        not even a call."""
        dispatch = self._dispatch
        kind, visit, leave, getter = dispatch.get(type(node)) or self._entry(type(node))
        if kind != _OTHER:
            self._enter(node, kind)
        if visit is None or visit(self, node) is not False:
            collect = self.collect
            for value in getter(node):
                value_type = type(value)
                if value_type is tuple or value_type is list:
                    for child in value:  # type: ignore[attr-defined]
                        if type(child) not in _LEAVES:
                            collect(child)
                elif value_type not in NOT_NODES and value_type not in _LEAVES:
                    collect(value)  # type: ignore[arg-type]
        if leave is not None:
            leave(self, node)
        if kind != _OTHER:
            self._leave(node, kind)

    def on_visit(self, node: cst.CSTNode) -> bool:
        kind, visit, _, _ = self._dispatch.get(type(node)) or self._entry(type(node))
        if kind != _OTHER:
            self._enter(node, kind)
        return visit is None or visit(self, node) is not False

    def _enter(self, node: cst.CSTNode, kind: int) -> None:
        if kind == _BLOCK:
            self.blocks.append(node)  # type: ignore[arg-type]
        elif id(node) not in self._elifs:
            if type(node) is cst.If and type(node.orelse) is cst.If:  # type: ignore[attr-defined]
                self._mark_elifs(node.orelse)  # type: ignore[attr-defined]
            self._enter_statement(node)  # type: ignore[arg-type]

    def _mark_elifs(self, node: cst.If) -> None:
        self._elifs.add(id(node))
        if type(node.orelse) is cst.If:
            self._mark_elifs(node.orelse)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        kind, _, leave, _ = self._dispatch.get(type(original_node)) or self._entry(type(original_node))
        if leave is not None:
            leave(self, original_node)
        if kind != _OTHER:
            self._leave(original_node, kind)

    def _leave(self, node: cst.CSTNode, kind: int) -> None:
        if kind == _BLOCK:
            self.blocks.pop()
        elif id(node) not in self._elifs:
            frame = self.frame
            if type(node) in (cst.FunctionDef, cst.ClassDef) and len(self.frames) > 1:
                if frame.scope.node is node:
                    self.frames.pop()
                    frame = self.frame
            frame.stmts.pop()
            if type(node) is cst.For and frame.loops and frame.loops[-1].node is node:
                frame.loops.pop()

    def _enter_statement(self, node: cst.BaseStatement) -> None:
        frame = self.frame
        self.order += 1
        stmts = frame.stmts
        # in a loop: some statement of the path is one (the parent's path is the path less the parent)
        parent = stmts[-1] if stmts else None
        ref = StmtRef(
            stmt=node,
            block=self.blocks[-1],
            order=self.order,
            path=tuple(stmts),
            in_loop=parent is not None and (parent.in_loop or type(parent.stmt) in (cst.For, cst.While)),
        )
        stmts.append(ref)
        if parent is None and frame.scope is self.module_scope:
            self._track_import_block(node, ref)

    def _track_import_block(self, node: cst.BaseStatement, ref: StmtRef) -> None:
        if not self.leading_imports:
            return
        if type(node) is cst.SimpleStatementLine and all(
            type(s) in (cst.Import, cst.ImportFrom)
            or (type(s) is cst.Expr and type(s.value) is cst.SimpleString)
            for s in node.body
        ):
            return
        self.leading_imports = False
        self.import_block_end = ref

    @property
    def here(self) -> StmtRef:
        stmts = self.frame.stmts
        if stmts:
            return stmts[-1]
        # A one-line body (`def __init__(self): self.n = 0`) holds no statement of its own: its
        # small statements belong to the def line, the enclosing frame's current statement.
        return self.frames[-2].stmts[-1]

    def _new_scope(self, node: ScopeNode, name: str) -> Scope:
        scope = Scope(node=node, name=name, parent=self.frame.scope)
        self.scopes.append(scope)
        # The def statement itself belongs to the enclosing frame; its body to the new one.
        self.frames.append(_Frame(scope, stmts=[]))
        return scope

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name.value, None)
        scope = self._new_scope(node, node.name.value)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.params.append(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if type(star) is cst.Param:
                scope.params.append(star.name.value)
        scope.simple_signature = (
            not params.posonly_params
            and not params.kwonly_params
            and type(params.star_arg) is not cst.Param
            and params.star_kwarg is None
            and all(p.default is None for p in params.params)
        )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._bind(node.name.value, None)
        self._new_scope(node, node.name.value)

    # -- imports and bindings ---------------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> None:
        self.aliases.record_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.aliases.record_import_from(node)

    def _bind(self, name: str, value: cst.BaseExpression | None, loop_target: bool = False) -> Binding:
        binding = Binding(name, value, self.here, loop_target)
        self.frame.scope.bindings.setdefault(name, []).append(binding)
        return binding

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if dotted_name(target.target) in ("builtins.print", "__builtin__.print"):
                self.patches_print = True
        single = len(node.targets) == 1 and self._simple_target(node.targets[0].target) is not None
        for target in node.targets:
            names = target_names(target.target) or [n for n in [self._self_attribute(target.target)] if n]
            for name in names:
                binding = self._bind(name, node.value if single else None)
                if single and self._is_accelerator_call(node.value):
                    self.frame.scope.accelerators.append(binding)
        if single:
            name = self._simple_target(node.targets[0].target)
            assert name is not None
            if is_device_choice(node.value, self.aliases) or _is_gpu_index(name, node.value):
                self.frame.scope.devices.append(DeviceBinding(name, self.here, node.value))
        elif len(node.targets) == 1 and is_device_choice(node.value, self.aliases):
            # `args.device = torch.device("cuda" if ... else "cpu")`: the device kept on the
            # namespace every function receives; it becomes `args.device = accelerator.device`.
            held = _held_attribute(node.targets[0].target)
            if held is not None:
                self.frame.scope.devices.append(DeviceBinding(held, self.here, node.value))
        self._extend_batch_names(node)

    def _self_attribute(self, expr: cst.BaseExpression) -> str | None:
        """`self.model` inside a method: instance state, tracked as the name "self.model"."""
        scope = self.frame.scope
        if not (scope.is_method and scope.params):
            return None
        return instance_attribute(expr, receiver=scope.params[0])

    def _simple_target(self, expr: cst.BaseExpression) -> str | None:
        if type(expr) is cst.Name:
            return expr.value
        return self._self_attribute(expr)

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None and self.frame.stmts:
            self.frame.scope.returns.append(node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        for name in target_names(node.target):
            self._bind(name, node.value)

    def visit_If(self, node: cst.If) -> None:
        # Only the if-statement at the head of an if/elif chain counts, not a nested `elif`.
        if self.here.stmt is not node:
            return
        name = device_if_target(node, self.aliases)
        if name is not None:
            self.frame.scope.devices.append(DeviceBinding(name, self.here, None))

    def _extend_batch_names(self, node: cst.Assign) -> None:
        """`x, y = batch` or `inputs = batch["x"]` inside a loop: x, y and inputs are batch data."""
        loops = self.frame.loops
        if not loops or _contains_call(node.value):
            return
        root = _value_root(node.value)
        for loop in loops:
            if root in loop.batch_names:
                for target in node.targets:
                    loop.batch_names.update(target_names(target.target))

    def _is_accelerator_call(self, value: cst.BaseExpression) -> bool:
        return type(value) is cst.Call and self.aliases.qualify(value.func) in ACCELERATOR_CLASSES

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "module" and type(node.value) is cst.Name and self.frame.stmts:
            self.frame.scope.module_accesses.append((node, self.here))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        """`x == 0` / `x != 0` / `0 == x`: candidate rank-0 checks."""
        if len(node.comparisons) != 1 or not self.frame.stmts:
            return
        target = node.comparisons[0]
        if type(target.operator) not in (cst.Equal, cst.NotEqual):
            return
        equal = type(target.operator) is cst.Equal
        left, right = node.left, target.comparator
        if _is_zero(right):
            self.frame.scope.zero_comparisons.append((node, left, equal))
        elif _is_zero(left):
            self.frame.scope.zero_comparisons.append((node, right, equal))

    # -- loops ---------------------------------------------------------------------------

    def visit_For(self, node: cst.For) -> None:
        names = target_names(node.target)
        for name in names:
            self._bind(name, None, loop_target=True)
        loop = Loop(node=node, source=self._loop_source(node.iter), batch_names=set(names), where=self.here,
                    scope=self.frame.scope)
        loop.accumulating = _is_accumulate_block(node.body)
        self.frame.scope.loops.append(loop)
        self.frame.loops.append(loop)

    def _loop_source(self, expr: cst.BaseExpression) -> str | None:
        while type(expr) is cst.Call and expr.args:
            name = dotted_name(expr.func)
            qualified = self.aliases.qualify(expr.func) or name
            method = expr.func.attr.value if type(expr.func) is cst.Attribute else None
            if name not in LOOP_WRAPPERS and qualified not in LOOP_WRAPPERS and method not in LOOP_WRAPPER_METHODS:
                return None
            expr = expr.args[0].value
        if type(expr) is cst.Name:
            return expr.value
        return self._self_attribute(expr)

    # -- calls ---------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        if not self.frame.stmts:
            return  # decorators and default values of a def: not code of this scope
        func = node.func
        scope = self.frame.scope
        loops = tuple(self.frame.loops)
        qualified = self.aliases.qualify(func)
        if qualified is not None:
            scope.library_calls.append(LibraryCall(qualified, node, self.here, loops))
        if type(func) is cst.Name:
            scope.calls.append(CallSite(func.value, node, self.here, loops))
            for loop in loops:
                loop.callees.add(func.value)
            return
        if type(func) is not cst.Attribute:
            return
        method = func.attr.value
        receiver = func.value
        if self._self_attribute(func) is not None:
            # `self.train_step(x, y)`: a call of a sibling method, tracked as "self.train_step".
            callee = f"self.{method}"
            scope.calls.append(CallSite(callee, node, self.here, loops))
            for loop in loops:
                loop.callees.add(callee)
        if type(receiver) is cst.Name:
            scope.method_calls.append(Site(node, receiver, self.here, loops))
        elif type(receiver) is cst.Attribute and type(receiver.value) is cst.Name and receiver.value.value != "self":
            scope.member_calls.append(Site(node, receiver, self.here, loops))
        if method == "backward" and self._is_tensor_backward(receiver):
            scope.backwards.append(Site(node, receiver, self.here, loops))
            self._mark_training_loops()
        elif method == "backward" and self._is_accelerator_receiver(receiver):
            self._mark_training_loops()  # already migrated: still a training loop
        elif method == "step" and not node.args:
            scope.steps.append(Site(node, receiver, self.here, loops))
        elif method in ("to", "cuda"):
            self._record_move(node, receiver, method, loops)
        elif method == "gather_for_metrics" and type(receiver) is cst.Name:
            for loop in loops:
                loop.gathers = True
        elif method == "prepare" and self._is_accelerator_receiver(receiver):
            for arg in node.args:
                name = self._simple_target(arg.value)
                if name is not None:
                    scope.prepared.add(name)

    def _is_accelerator_receiver(self, receiver: cst.BaseExpression) -> bool:
        if type(receiver) is cst.Name:
            return self._is_accelerator_name(receiver.value)
        return self._self_attribute(receiver) == "self.accelerator"

    def _mark_training_loops(self) -> None:
        # Enclosing functions' loops too: a closure defined in a loop (`optimizer.step(closure)`,
        # LBFGS) trains in that loop.
        for frame in self.frames:
            for loop in frame.loops:
                loop.has_backward = True

    def _is_accelerator_name(self, name: str) -> bool:
        scope: Scope | None = self.frame.scope
        while scope is not None:
            if any(b.name == name for b in scope.accelerators) or (name == "accelerator" and name in scope.params):
                return True
            scope = scope.parent
        return name == "accelerator"

    def _is_tensor_backward(self, receiver: cst.BaseExpression) -> bool:
        if type(receiver) is cst.Name and self._is_accelerator_name(receiver.value):
            return False
        if self._self_attribute(receiver) == "self.accelerator":
            return False
        qualified = self.aliases.qualify(receiver)
        return qualified is None or not qualified.startswith("torch")  # torch.autograd.backward

    def _record_move(self, node: cst.Call, receiver: cst.BaseExpression, method: str, loops: tuple[Loop, ...]) -> None:
        if method == "cuda":
            kept = tuple(a for a in node.args if a.keyword is not None and a.keyword.value not in ("non_blocking",))
            if kept or any(a.keyword is None for a in node.args[1:]):
                return
            device_arg = None
        else:
            device_arg = None
            kept_list: list[cst.Arg] = []
            for index, arg in enumerate(node.args):
                keyword = arg.keyword.value if arg.keyword is not None else None
                if keyword == "device" or (keyword is None and index == 0 and device_arg is None):
                    device_arg = arg.value
                elif keyword in ("non_blocking", "copy") or (keyword is None and index > 0 and _is_bool(arg.value)):
                    continue
                else:
                    kept_list.append(arg)
            if device_arg is None:
                return
            kept = tuple(kept_list)
        self.frame.scope.moves.append(Move(node, receiver, device_arg, kept, self.here, loops))


def _held_attribute(target: cst.BaseExpression) -> str | None:
    """"args.device" for a target `args.device` (an attribute of a plain name)."""
    if type(target) is cst.Attribute and type(target.value) is cst.Name:
        return f"{target.value.value}.{target.attr.value}"
    return None


def _is_accumulate_block(body: cst.BaseSuite) -> bool:
    if type(body) is not cst.IndentedBlock or len(body.body) != 1:
        return False
    stmt = body.body[0]
    if type(stmt) is not cst.With:
        return False
    return any(
        type(item.item) is cst.Call
        and type(item.item.func) is cst.Attribute
        and item.item.func.attr.value == "accumulate"
        for item in stmt.items
    )


def _is_zero(expr: cst.BaseExpression) -> bool:
    return type(expr) is cst.Integer and expr.value == "0"


def _is_bool(expr: cst.BaseExpression) -> bool:
    return type(expr) is cst.Name and expr.value in ("True", "False")


def _contains_call(expr: cst.BaseExpression) -> bool:
    finder = _CallFinder()
    walk(expr, finder)
    return finder.found


class _CallFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        self.found = True
        return False


def _value_root(expr: cst.BaseExpression) -> str | None:
    if type(expr) in (cst.Tuple, cst.List) and expr.elements:
        roots = {_value_root(e.value) for e in expr.elements}
        return roots.pop() if len(roots) == 1 else None
    return root_name(expr)


# -- device choice ------------------------------------------------------------------------

_DEVICE_STRINGS = ("cuda", "cpu", "mps", "xpu")
_AVAILABILITY_CHECKS = ("torch.cuda.is_available", "torch.backends.mps.is_available", "torch.xpu.is_available")


_GPU_INDEX_NAMES = re.compile(r"^(device|gpu|gpu_id|device_id|cuda_device)$")


def _is_gpu_index(name: str, value: cst.BaseExpression) -> bool:
    """`device = 0` / `gpu_id = 0`: a literal GPU index chosen for the one process (the DDP
    tutorial's single-GPU script). Every rank would use cuda:0; it is a device choice like
    `torch.device("cuda:0")`. Only for names that say they hold a device."""
    return type(value) is cst.Integer and _GPU_INDEX_NAMES.match(name) is not None


def is_device_choice(expr: cst.BaseExpression, aliases: ImportAliases) -> bool:
    """`torch.device(...)`, `"cuda" if torch.cuda.is_available() else "cpu"`, `"cuda:0"`,
    `f"cuda:{local_rank}"`, `torch.accelerator.current_accelerator()` (optionally `.type`)."""
    if type(expr) is cst.Call:
        qualified = aliases.qualify(expr.func)
        return qualified in ("torch.device", "torch.accelerator.current_accelerator")
    if type(expr) is cst.Attribute and expr.attr.value == "type":
        return is_device_choice(expr.value, aliases)
    if type(expr) is cst.IfExp:
        return is_device_choice(expr.body, aliases) and is_device_choice(expr.orelse, aliases)
    if type(expr) is cst.SimpleString:
        text = expr.evaluated_value
        return isinstance(text, str) and text.split(":", 1)[0] in _DEVICE_STRINGS
    if type(expr) is cst.FormattedString:
        # `f"cuda:{local_rank}"`: a device type and an index formatted in
        parts = expr.parts
        return (len(parts) == 2 and type(parts[0]) is cst.FormattedStringText
                and parts[0].value in ("cuda:", "xpu:") and type(parts[1]) is cst.FormattedStringExpression)
    return False


def device_if_target(node: cst.If, aliases: ImportAliases) -> str | None:
    """The device name of `if torch.cuda.is_available(): device = ... else: device = ...`."""
    if not _mentions_availability(node.test, aliases):
        return None
    names: set[str] = set()
    branch: cst.If | cst.Else | None = node
    while branch is not None:
        body = branch.body
        if type(body) is not cst.IndentedBlock:
            return None
        for stmt in body.body:
            if not (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1):
                return None
            small = stmt.body[0]
            if (
                type(small) is cst.Expr
                and type(small.value) is cst.Call
                and aliases.qualify(small.value.func) == "torch.cuda.set_device"
            ):
                continue  # part of choosing the device (removed with the rest of the boilerplate)
            if not (
                type(small) is cst.Assign
                and len(small.targets) == 1
                and type(small.targets[0].target) is cst.Name
                and is_device_choice(small.value, aliases)
            ):
                return None
            names.add(small.targets[0].target.value)
        branch = branch.orelse if type(branch) is cst.If else None
    return names.pop() if len(names) == 1 else None


def _mentions_availability(expr: cst.BaseExpression, aliases: ImportAliases) -> bool:
    if type(expr) is cst.Call:
        return aliases.qualify(expr.func) in _AVAILABILITY_CHECKS
    if type(expr) is cst.UnaryOperation:
        return _mentions_availability(expr.expression, aliases)
    if type(expr) is cst.BooleanOperation:
        return _mentions_availability(expr.left, aliases) or _mentions_availability(expr.right, aliases)
    return False


def _follow_wrapped_sources(collector: _Collector) -> None:
    """`progress = tqdm(loader)` ... `for batch in progress`: the loop iterates `loader`."""
    for scope in collector.scopes:
        for loop in scope.loops:
            bindings = scope.bindings.get(loop.source or "", [])
            if len(bindings) != 1 or type(bindings[0].value) is not cst.Call:
                continue
            inner = collector._loop_source(bindings[0].value)
            if inner is not None and inner != loop.source:
                loop.source = inner


def analyze(module: cst.Module, text: str | None = None) -> Facts:
    collector = _Collector(module)
    collector.collect(module)
    _follow_wrapped_sources(collector)
    functions: dict[str, Scope] = {}
    for s in collector.scopes:
        if not s.is_function or s.is_method or s.parent is None:
            continue
        if s.parent is collector.module_scope:
            functions[s.name] = s
        elif s.parent.is_function:
            s.parent.local_functions[s.name] = s
    classes = {s.name: s for s in collector.scopes if type(s.node) is cst.ClassDef and s.parent is collector.module_scope}
    return Facts(
        classes=classes,
        module=module,
        aliases=collector.aliases,
        scopes=collector.scopes,
        functions=functions,
        module_scope=collector.module_scope,
        import_block_end=collector.import_block_end,
        patches_print=collector.patches_print,
        text=text,
    )
