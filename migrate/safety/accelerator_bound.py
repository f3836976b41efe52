"""`accelerator` is bound on every path before each use (AM101, accelerator-bound).

What it checks:
    A definitely-assigned analysis of the name `accelerator`, per scope, over the migrated output:
    - in a function (or the module, or a notebook, whose cells are migrated as one script in cell
      order) that binds `accelerator` itself or takes it as a parameter, every read comes after a
      binding on every path: both branches of an `if`, a `try` body that may fail before the
      binding (its handlers and `finally` start from the state before the `try`), `for`/`while`
      bodies that may run zero times, and `return`/`raise`/`break`/`continue`;
    - a function that reads `accelerator` without binding it reads the enclosing function's or
      the module's: the module (or that function) must never call it, directly or through the
      functions and constructors it calls, before its own binding; a module that reads a global
      `accelerator` must bind one;
    - `self.accelerator` read in a method: the class (or a base class of this file) sets it in
      some method, and `__init__` neither reads it nor calls a method that reads it before it is
      set. A class that never sets it (an `nn.Module` whose `forward` now prints through
      `self.accelerator`, nobody having given it one) fails.

Why:
    A rewrite that creates the Accelerator in one branch of the device `if`, converts `print` in a
    data-download helper that runs before the Accelerator exists, or reads it in a notebook cell
    above the one creating it, turns a working script into a NameError, an UnboundLocalError or an
    AttributeError: worse than no rewrite.

What it cannot see:
    Calls it cannot resolve by name (a function passed as a callback, a method called on an
    instance outside its class), order between methods other than `__init__`, and bases defined in
    another module (a class whose base is imported may get `self.accelerator` from it). Problems
    already present in the input are not reported: the check is about what the rewrite added.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from migrate.safety import CheckContext, Violation
from migrate.walk import children

CODE = "AM101"
NAME = "accelerator-bound"

_NAME = "accelerator"
# Bases known not to provide `self.accelerator`.
_PLAIN_BASES = frozenset({"Module", "object", "Dataset", "IterableDataset", "Sequential", "ModuleList", "ModuleDict"})

Found = list[tuple[cst.CSTNode, str]]


def check(context: CheckContext) -> list[Violation]:
    after = analyse(context.after)
    if not after:
        return []
    before = Counter(message for _, message in analyse(context.before))
    positions = line_of(context)
    violations: list[Violation] = []
    for node, message in after:
        if before[message] > 0:
            before[message] -= 1  # already so in the input: not the rewrite's doing
            continue
        violations.append(Violation(positions(node), message))
    return violations


def line_of(context: CheckContext):  # type: ignore[no-untyped-def]
    """A node -> output line lookup; the lines are computed on the first lookup and shared by every
    check through the context (a check that finds nothing pays nothing for positions)."""
    return context.line_of


# -- what a statement does with the name --------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """The name tracked: `accelerator`, or `self.accelerator` (self = the method's first parameter)."""

    self_name: str | None = None

    @property
    def label(self) -> str:
        return f"{self.self_name}.{_NAME}" if self.self_name else _NAME

    def is_read(self, node: cst.CSTNode) -> bool:
        if self.self_name is None:
            return type(node) is cst.Name and node.value == _NAME
        return (
            type(node) is cst.Attribute
            and node.attr.value == _NAME
            and type(node.value) is cst.Name
            and node.value.value == self.self_name
        )

    def is_bound_by(self, target: cst.BaseExpression) -> bool:
        if type(target) in (cst.Tuple, cst.List):
            return any(self.is_bound_by(e.value) for e in target.elements)
        if type(target) is cst.StarredElement:
            return self.is_bound_by(target.value)
        return self.is_read(target)


def _callee(call: cst.Call) -> str | None:
    func = call.func
    if type(func) is cst.Name:
        return func.value
    if type(func) is cst.Attribute:
        owner = func.value
        if type(owner) is cst.Name:
            return f"{owner.value}.{func.attr.value}"  # `self.fit`, `Base.__init__`
        if type(owner) is cst.Call and type(owner.func) is cst.Name and owner.func.value == "super":
            return f"super.{func.attr.value}"
    return None


class _Events:
    """Reads of the target and calls, in evaluation order, in one expression or small statement,
    and whether it binds the target with `:=` (`walrus`: outside a lambda, as `_walrus_binds`
    finds it, in the same walk)."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.reads: list[cst.CSTNode] = []
        self.calls: list[tuple[cst.Call, str]] = []
        self.walrus = False
        self._lambdas = 0  # lambdas around the node being walked: a `:=` there binds the lambda's name

    def collect(self, node: cst.CSTNode) -> "_Events":
        kind = type(node)
        if kind is cst.Name:
            if node.value == _NAME and self.target.self_name is None:
                self.reads.append(node)
            return self
        if kind is cst.Attribute:
            if self.target.self_name is not None and self.target.is_read(node):
                self.reads.append(node)
                return self
            return self.collect(node.value)
        special = _SPECIAL.get(kind)
        if special is not None:
            special(self, node)
            return self
        for child in children(node):
            self.collect(child)
        return self

    def _nothing(self, node: cst.CSTNode) -> None:
        """Imports, `global`/`nonlocal` (names only), defs and classes (their own scopes), literals."""

    def _arg(self, node: cst.Arg) -> None:
        self.collect(node.value)

    def _param(self, node: cst.Param) -> None:
        for part in (node.annotation, node.default):
            if part is not None:
                self.collect(part)

    def _assign(self, node: cst.Assign) -> None:
        self.collect(node.value)
        for target in node.targets:
            self._target(target.target)

    def _ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.collect(node.value)
        self._target(node.target)
        self._walrus_in(node.annotation)  # not read here, but a `:=` in it binds

    def _aug_assign(self, node: cst.AugAssign) -> None:
        self.collect(node.target)  # `x += 1` reads x first
        self.collect(node.value)

    def _del(self, node: cst.Del) -> None:
        self._target(node.target)

    def _comp_for(self, node: cst.CompFor) -> None:
        self._walrus_in(node.target)
        self.collect(node.iter)
        for condition in node.ifs:
            self.collect(condition)
        if node.inner_for_in is not None:
            self.collect(node.inner_for_in)

    def _named_expr(self, node: cst.NamedExpr) -> None:
        if not self._lambdas and self.target.is_bound_by(node.target):
            self.walrus = True
        self.collect(node.value)

    def _lambda(self, node: cst.Lambda) -> None:
        self._lambdas += 1
        for child in children(node):
            self.collect(child)
        self._lambdas -= 1

    def _expr(self, node: cst.Expr) -> None:
        self.collect(node.value)

    def _call(self, node: cst.Call) -> None:
        self.collect(node.func)
        for arg in node.args:
            self.collect(arg)
        callee = _callee(node)
        if callee is not None:
            self.calls.append((node, callee))  # the callee runs after its arguments

    def _walrus_in(self, node: cst.CSTNode) -> None:
        if not self._lambdas and not self.walrus and _walrus_binds(node, self.target):
            self.walrus = True

    def _target(self, target: cst.BaseExpression) -> None:
        """An assignment target: a plain name (or `self.accelerator`) is written, not read."""
        if type(target) in (cst.Tuple, cst.List):
            for element in target.elements:
                self._target(element.value)
        elif type(target) is cst.StarredElement:
            self._target(target.value)
        elif self.target.is_read(target) or type(target) is cst.Name:
            return
        elif type(target) is cst.Attribute:
            self.collect(target.value)
        else:
            self.collect(target)


# What `_Events.collect` does with a node of these types instead of walking all its children.
_SPECIAL: dict[type, Callable[[_Events, Any], None]] = {
    cst.Import: _Events._nothing, cst.ImportFrom: _Events._nothing, cst.Global: _Events._nothing,
    cst.Nonlocal: _Events._nothing, cst.FunctionDef: _Events._nothing, cst.ClassDef: _Events._nothing,
    cst.Arg: _Events._arg, cst.Param: _Events._param, cst.Assign: _Events._assign,
    cst.AnnAssign: _Events._ann_assign, cst.AugAssign: _Events._aug_assign, cst.Del: _Events._del,
    cst.CompFor: _Events._comp_for, cst.NamedExpr: _Events._named_expr, cst.Lambda: _Events._lambda,
    cst.Call: _Events._call, cst.Expr: _Events._expr,
    # leaves: nothing to walk
    cst.SimpleString: _Events._nothing, cst.Integer: _Events._nothing, cst.Float: _Events._nothing,
    cst.Imaginary: _Events._nothing, cst.FormattedStringText: _Events._nothing, cst.Ellipsis: _Events._nothing,
}


class _EventCache:
    """The events of each node for each target, collected once per analysis: a function's
    statements are read by `_describe`, then by its flow, and a method's again by its class."""

    def __init__(self) -> None:
        # the node is kept with its events: its id stays its own (`_own_statements` makes lines)
        self._done: dict[tuple[int, str | None], tuple[cst.CSTNode, _Events]] = {}

    def __call__(self, node: cst.CSTNode, target: _Target) -> _Events:
        key = (id(node), target.self_name)
        done = self._done.get(key)
        if done is None:
            done = self._done[key] = (node, _Events(target).collect(node))
        return done[1]


def _binds(small: cst.BaseSmallStatement, t: _Target) -> bool:
    if type(small) is cst.Assign:
        return any(t.is_bound_by(target.target) for target in small.targets)
    if type(small) is cst.AnnAssign:
        return small.value is not None and t.is_bound_by(small.target)
    if type(small) is cst.AugAssign:
        return t.is_bound_by(small.target)
    if type(small) in (cst.Import, cst.ImportFrom) and t.self_name is None:
        names = small.names
        if type(names) is cst.ImportStar:
            return False
        for alias in names:
            bound = alias.asname.name if alias.asname is not None else alias.name
            if type(bound) is cst.Name and bound.value == _NAME:
                return True
    return False


def _walrus_binds(node: cst.CSTNode, t: _Target) -> bool:
    if type(node) is cst.NamedExpr and t.is_bound_by(node.target):
        return True
    if type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
        return False
    return any(_walrus_binds(child, t) for child in children(node))


# -- the flow analysis -----------------------------------------------------------------------------


State = bool | None  # True: bound on every path; False: maybe unbound; None: does not fall through


def _merge(*states: State) -> State:
    live = [s for s in states if s is not None]
    return all(live) if live else None


class _Flow:
    """Walks one scope's statements, reporting reads (and calls that need the target) while the
    target may be unbound."""

    def __init__(self, target: _Target, where: str, needy: dict[str, str], binders: set[str], found: Found,
                 events: _EventCache) -> None:
        self.t = target
        self.cache = events
        self.where = where
        self.needy = needy  # callee key -> who it is (what uses the target)
        self.binders = binders  # callee keys after whose call the target is bound
        self.found = found
        self.breaks: list[list[bool]] = []

    def block(self, stmts: Sequence[cst.BaseStatement], bound: State) -> State:
        for stmt in stmts:
            if bound is None:
                return None  # unreachable code after return/raise: nothing runs here
            bound = self.stmt(stmt, bound)
        return bound

    def suite(self, suite: cst.BaseSuite, bound: bool) -> State:
        if type(suite) is cst.IndentedBlock:
            return self.block(suite.body, bound)
        return self.smalls(suite.body, bound)  # `if x: a = 1`

    def events(self, node: cst.CSTNode | None, bound: bool) -> bool:
        """Report what `node` evaluates while unbound; return the state after it."""
        if node is None:
            return bound
        events = self.cache(node, self.t)
        if not bound:
            for read in events.reads:
                self.found.append((read, self._read_message()))
        after = bound
        for call, callee in events.calls:
            if not after and callee in self.needy:
                self.found.append((call, self._call_message(callee)))
            if callee in self.binders:
                after = True
        if not after and events.walrus:
            after = True
        return after

    def _read_message(self) -> str:
        label = self.t.label
        return (
            f"`{label}` is read in {self.where} before it is bound on every path (it is bound in only one "
            f"branch, after this line, or in a loop or `try` that may not run it): this line would raise "
            f"{'AttributeError' if self.t.self_name else 'NameError/UnboundLocalError'}"
        )

    def _call_message(self, callee: str) -> str:
        label = self.t.label
        return (
            f"{self.where} calls `{callee}` (which uses `{label}`: {self.needy[callee]}) before `{label}` "
            "is bound on every path: the call would raise NameError"
        )

    def smalls(self, body: Sequence[cst.BaseSmallStatement], bound: bool) -> State:
        for small in body:
            state: bool = self.events(small, bound)
            if type(small) is cst.Del and self.t.is_bound_by(small.target):
                state = False
            elif _binds(small, self.t):
                state = True
            if type(small) in (cst.Return, cst.Raise, cst.Continue):
                return None
            if type(small) is cst.Break:
                if self.breaks:
                    self.breaks[-1].append(state)
                return None
            bound = state
        return bound

    def stmt(self, stmt: cst.BaseStatement, bound: bool) -> State:
        if type(stmt) is cst.SimpleStatementLine:
            return self.smalls(stmt.body, bound)
        if type(stmt) is cst.If:
            bound = self.events(stmt.test, bound)
            body = self.suite(stmt.body, bound)
            if stmt.orelse is None:
                other: State = bound
            elif type(stmt.orelse) is cst.If:
                other = self.stmt(stmt.orelse, bound)
            else:
                other = self.suite(stmt.orelse.body, bound)
            return _merge(body, other)
        if type(stmt) in (cst.For, cst.While):
            return self._loop(stmt, bound)
        if type(stmt) in (cst.Try, cst.TryStar):
            body = self.suite(stmt.body, bound)
            handlers = [self.suite(h.body, bound) for h in stmt.handlers]
            normal = self.suite(stmt.orelse.body, body) if stmt.orelse is not None and body is not None else body
            result = _merge(normal, *handlers)
            if stmt.finalbody is not None:
                final = self.suite(stmt.finalbody.body, bound)
                if final is None:
                    return None
                if final and result is not None:
                    result = True
            return result
        if type(stmt) is cst.With:
            for item in stmt.items:
                bound = self.events(item.item, bound)
                if item.asname is not None and self.t.is_bound_by(item.asname.name):
                    bound = True
            return self.suite(stmt.body, bound)
        if type(stmt) is cst.FunctionDef:
            for decorator in stmt.decorators:
                bound = self.events(decorator, bound)
            self.events(stmt.params, bound)  # default values are evaluated now
            return bound
        if type(stmt) is cst.ClassDef:
            for part in (*stmt.decorators, *stmt.bases, *stmt.keywords):
                bound = self.events(part, bound)
            self.suite(stmt.body, bound)  # the class body runs now; what it binds is the class's
            return bound
        if type(stmt) is cst.Match:
            bound = self.events(stmt.subject, bound)
            cases = [self.suite(case.body, bound) for case in stmt.cases]
            return _merge(bound, *cases)
        return bound

    def _loop(self, stmt: cst.For | cst.While, bound: bool) -> State:
        forever = False
        if type(stmt) is cst.For:
            bound = self.events(stmt.iter, bound)
            inside = bound or self.t.is_bound_by(stmt.target)
        else:
            bound = self.events(stmt.test, bound)
            inside = bound
            forever = type(stmt.test) is cst.Name and stmt.test.value == "True"
        self.breaks.append([])
        self.suite(stmt.body, inside)  # bindings of one iteration do not reach the first one
        breaks = self.breaks.pop()
        if forever:
            return _merge(*breaks)
        normal: State = bound  # the body may run zero times
        if stmt.orelse is not None:
            normal = self.suite(stmt.orelse.body, bound)
        return _merge(normal, *breaks)


# -- scopes -------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Fn:
    node: cst.FunctionDef
    parent: "_Fn | None"  # enclosing function (classes skipped)
    cls: "_Class | None"  # the class this is a method of
    status: str = "free"  # param | local | global | free
    reads: bool = False  # its own body reads `accelerator`
    calls: set[str] = field(default_factory=set)
    qualname: str = ""

    @property
    def name(self) -> str:
        return self.node.name.value

    @property
    def self_name(self) -> str | None:
        params = self.node.params
        first = [*params.posonly_params, *params.params]
        if self.cls is None or not first:
            return None
        if any(type(d.decorator) is cst.Name and d.decorator.value in ("staticmethod", "classmethod") for d in self.node.decorators):
            return None
        return first[0].name.value


@dataclass(eq=False)
class _Class:
    node: cst.ClassDef
    parent: _Fn | None
    methods: dict[str, _Fn] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name.value


def _own_statements(body: cst.BaseSuite) -> Iterable[cst.CSTNode]:
    """Every statement of a block, nested blocks included, not entering defs and classes."""
    stmts = body.body if type(body) is cst.IndentedBlock else [cst.SimpleStatementLine(body=body.body)]
    for stmt in stmts:
        yield stmt
        if type(stmt) in (cst.FunctionDef, cst.ClassDef) or type(stmt) is cst.SimpleStatementLine:
            continue
        for suite in _suites(stmt):
            yield from _own_statements(suite)


def _suites(stmt: cst.BaseStatement) -> list[cst.BaseSuite]:
    out: list[cst.BaseSuite] = []
    for name in ("body", "orelse", "finalbody"):
        part = getattr(stmt, name, None)
        if isinstance(part, cst.BaseSuite):
            out.append(part)
        elif type(part) in (cst.Else, cst.Finally):
            out.append(part.body)
        elif type(part) is cst.If:
            out.extend(_suites(part))
    for handler in getattr(stmt, "handlers", ()):
        out.append(handler.body)
    for case in getattr(stmt, "cases", ()):
        out.append(case.body)
    return out


class _Collector:
    def __init__(self, module: cst.Module) -> None:
        self.fns: list[_Fn] = []
        self.classes: list[_Class] = []
        self.module_fns: dict[str, _Fn] = {}
        self.module_classes: dict[str, _Class] = {}
        self._scan(module.body, None, None, "")

    def _scan(self, stmts: Sequence[cst.BaseStatement], fn: _Fn | None, cls: _Class | None, prefix: str) -> None:
        for stmt in stmts:
            if type(stmt) is cst.FunctionDef:
                new = _Fn(stmt, fn, cls, qualname=f"{prefix}{stmt.name.value}")
                self.fns.append(new)
                if cls is not None:
                    cls.methods[new.name] = new
                elif fn is None:
                    self.module_fns[new.name] = new
                self._scan(_body(stmt.body), new, None, f"{new.qualname}.")
            elif type(stmt) is cst.ClassDef:
                klass = _Class(stmt, fn)
                self.classes.append(klass)
                if fn is None and cls is None:
                    self.module_classes[klass.name] = klass
                self._scan(_body(stmt.body), fn, klass, f"{prefix}{stmt.name.value}.")
            elif type(stmt) is not cst.SimpleStatementLine:
                for suite in _suites(stmt):
                    self._scan(_body(suite), fn, cls if cls is not None else None, prefix)


def _body(suite: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return suite.body if type(suite) is cst.IndentedBlock else ()


def _describe(fn: _Fn, body: cst.BaseSuite, events_of: _EventCache) -> None:
    t = _Target()
    params = fn.node.params
    names = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
    names += [s.name.value for s in (params.star_arg, params.star_kwarg) if type(s) is cst.Param]
    declared = None
    assigns = False
    for stmt in _own_statements(body):
        if type(stmt) is cst.SimpleStatementLine:
            for small in stmt.body:
                if type(small) in (cst.Global, cst.Nonlocal) and any(n.name.value == _NAME for n in small.names):
                    declared = "global" if type(small) is cst.Global else "nonlocal"
                assigns = assigns or _binds(small, t)
                events = events_of(small, t)
                fn.reads = fn.reads or bool(events.reads)
                fn.calls.update(c for _, c in events.calls)
            continue
        header = _Header(stmt)
        assigns = assigns or any(t.is_bound_by(target) for target in header.targets)
        for part in header.expressions:
            events = events_of(part, t)
            fn.reads = fn.reads or bool(events.reads)
            fn.calls.update(c for _, c in events.calls)
        if type(stmt) is cst.FunctionDef and stmt.name.value == _NAME:
            assigns = True
    if _NAME in names:
        fn.status = "param"
    elif declared == "global":
        fn.status = "global" if assigns else "free"
    elif declared == "nonlocal":
        fn.status = "free"
    elif assigns:
        fn.status = "local"


class _Header:
    """What a compound statement evaluates and binds itself (not its blocks)."""

    def __init__(self, stmt: cst.BaseStatement) -> None:
        self.expressions: list[cst.CSTNode] = []
        self.targets: list[cst.BaseExpression] = []
        if type(stmt) is cst.If:
            branch: cst.If | cst.Else | None = stmt
            while type(branch) is cst.If:
                self.expressions.append(branch.test)
                branch = branch.orelse
        elif type(stmt) is cst.For:
            self.expressions.append(stmt.iter)
            self.targets.append(stmt.target)
        elif type(stmt) is cst.While:
            self.expressions.append(stmt.test)
        elif type(stmt) is cst.With:
            for item in stmt.items:
                self.expressions.append(item.item)
                if item.asname is not None:
                    self.targets.append(item.asname.name)
        elif type(stmt) in (cst.Try, cst.TryStar):
            for handler in stmt.handlers:
                if handler.type is not None:
                    self.expressions.append(handler.type)
                if handler.name is not None:
                    self.targets.append(handler.name.name)
        elif type(stmt) is cst.FunctionDef:
            self.expressions.extend([*stmt.decorators, stmt.params])
        elif type(stmt) is cst.ClassDef:
            self.expressions.extend([*stmt.decorators, *stmt.bases, *stmt.keywords])
        elif type(stmt) is cst.Match:
            self.expressions.append(stmt.subject)


def analyse(module: cst.Module) -> Found:
    """Every read of `accelerator` / `self.accelerator` that may happen before its binding."""
    collected = _Collector(module)
    found: Found = []
    events_of = _EventCache()
    for fn in collected.fns:
        _describe(fn, fn.node.body, events_of)
    _check_names(module, collected, found, events_of)
    for klass in collected.classes:
        _check_class(klass, collected, found, events_of)
    return found


def _resolve(fn: _Fn) -> _Fn | None:
    """The function whose `accelerator` a free read in `fn` reads (None: the module's)."""
    parent = fn.parent
    while parent is not None:
        if parent.status in ("param", "local"):
            return parent
        parent = parent.parent
    return None


def _inside(fn: _Fn, ancestor: _Fn) -> bool:
    current: _Fn | None = fn
    while current is not None:
        if current is ancestor:
            return True
        current = current.parent
    return False


def _needy(collected: _Collector, owner: _Fn | None) -> dict[str, str]:
    """Callables of `owner` (module functions and classes, or `owner`'s nested functions) that use
    its `accelerator` when they run, directly or through what they call: callee key -> reason."""
    users = [fn for fn in collected.fns if fn.status == "free" and fn.reads and _resolve(fn) is owner]
    if not users:
        return {}
    if owner is None:
        callables = dict(collected.module_fns)
    else:
        callables = {fn.name: fn for fn in collected.fns if fn.parent is owner and fn.cls is None}
    needs: dict[int, str] = {}
    for fn in collected.fns:
        reader = next((u for u in users if _inside(u, fn)), None)
        if reader is not None:
            needs[id(fn)] = "it reads it" if reader is fn else f"`{reader.qualname}` reads it"
    classes = collected.module_classes if owner is None else {}
    changed = True
    while changed:
        changed = False
        for fn in collected.fns:
            if id(fn) in needs:
                continue
            for callee in fn.calls:
                target = callables.get(callee)
                if target is None and callee.startswith("self.") and fn.cls is not None:
                    target = fn.cls.methods.get(callee[5:])
                if target is None and callee in classes:
                    target = classes[callee].methods.get("__init__")
                if target is not None and id(target) in needs:
                    needs[id(fn)] = f"through `{target.qualname}`"
                    changed = True
                    break
    out = {name: needs[id(fn)] for name, fn in callables.items() if id(fn) in needs}
    for name, klass in classes.items():
        init = klass.methods.get("__init__")
        if init is not None and id(init) in needs:
            out[name] = f"its `__init__` {needs[id(init)] if needs[id(init)] != 'it reads it' else 'reads it'}"
    return out


def _check_names(module: cst.Module, collected: _Collector, found: Found, events_of: _EventCache) -> None:
    t = _Target()
    binders = {fn.name for fn in collected.module_fns.values() if fn.status == "global"}
    module_binds = bool(binders) or any(
        type(stmt) is cst.SimpleStatementLine and any(_binds(small, t) for small in stmt.body)
        or (type(stmt) is not cst.SimpleStatementLine and any(t.is_bound_by(x) for x in _Header(stmt).targets))
        for stmt in _module_statements(module)
    )
    _Flow(t, "the module", _needy(collected, None), binders, found, events_of).block(module.body, False)
    for fn in collected.fns:
        if fn.status in ("param", "local", "global"):
            entry = fn.status == "param" or (fn.status == "global" and module_binds)
            _Flow(t, f"`{fn.qualname}`", _needy(collected, fn), set(), found, events_of).suite(fn.node.body, entry)
        elif fn.reads and _resolve(fn) is None and not module_binds:
            for stmt in _own_statements(fn.node.body):
                parts = [stmt] if type(stmt) is cst.SimpleStatementLine else _Header(stmt).expressions
                for part in parts:
                    for read in events_of(part, t).reads:
                        found.append((read, (
                            f"`accelerator` is read in `{fn.qualname}`, which neither takes it as a parameter nor "
                            "creates it, and the module never binds it: calling it would raise NameError"
                        )))


def _module_statements(module: cst.Module) -> Iterable[cst.CSTNode]:
    yield from _own_statements(cst.IndentedBlock(body=module.body))


def _check_class(klass: _Class, collected: _Collector, found: Found, events_of: _EventCache) -> None:
    readers: dict[str, list[cst.CSTNode]] = {}
    setters: set[str] = set()
    for name, method in klass.methods.items():
        self_name = method.self_name
        if self_name is None:
            continue
        t = _Target(self_name)
        for stmt in _own_statements(method.node.body):
            parts = [stmt] if type(stmt) is cst.SimpleStatementLine else _Header(stmt).expressions
            for part in parts:
                readers.setdefault(name, []).extend(events_of(part, t).reads)
            if type(stmt) is cst.SimpleStatementLine and any(_binds(s, t) for s in stmt.body):
                setters.add(name)
    readers = {name: nodes for name, nodes in readers.items() if nodes}
    if not readers:
        return
    inherited, unknown = _bases(klass, collected, set())
    if not setters and not inherited:
        if unknown:
            return  # an imported base may set it
        module = " (an `nn.Module`: nobody passes it one)" if _is_module(klass) else ""
        for name, nodes in readers.items():
            for node in nodes:
                found.append((node, (
                    f"`self.accelerator` is read in `{klass.name}.{name}`, but `{klass.name}`{module} never sets "
                    "it: this line would raise AttributeError; give the class the accelerator in its constructor"
                )))
        return
    init = klass.methods.get("__init__")
    if init is None or init.self_name is None:
        return
    self_name = init.self_name
    needy: dict[str, str] = {}
    changed = True
    while changed:  # methods that read it, directly or through the methods they call
        changed = False
        for name, method in klass.methods.items():
            key = f"{self_name}.{name}"
            if key in needy or name == "__init__" or name in setters:
                continue
            if name in readers or any(c.startswith("self.") and f"{self_name}.{c[5:]}" in needy for c in _self_calls(method)):
                needy[key] = "it reads it" if name in readers else "through the methods it calls"
                changed = True
    binders = {f"{self_name}.{name}" for name in setters if name != "__init__"}
    if inherited:
        binders |= {"super.__init__", *(f"{base}.__init__" for base in _base_names(klass))}
    where = f"`{klass.name}.__init__`"
    _Flow(_Target(self_name), where, needy, binders, found, events_of).suite(init.node.body, False)
    for name in setters - {"__init__"}:
        if name in readers:
            entry = "__init__" in setters or inherited
            method = klass.methods[name]
            _Flow(_Target(method.self_name), f"`{klass.name}.{name}`", {}, set(), found, events_of).suite(
                method.node.body, entry)


def _self_calls(method: _Fn) -> set[str]:
    """`self.x(...)` calls of a method, written as `self.x` whatever its first parameter is called."""
    self_name = method.self_name
    out: set[str] = set()
    for callee in method.calls:
        if self_name and callee.startswith(f"{self_name}."):
            out.add("self." + callee[len(self_name) + 1:])
    return out


def _base_names(klass: _Class) -> list[str]:
    names = []
    for base in klass.node.bases:
        value = base.value
        parts: list[str] = []
        while type(value) is cst.Attribute:
            parts.append(value.attr.value)
            value = value.value
        if type(value) is cst.Name:
            parts.append(value.value)
            names.append(".".join(reversed(parts)))
    return names


def _bases(klass: _Class, collected: _Collector, seen: set[int]) -> tuple[bool, bool]:
    """(an in-file base sets `self.accelerator`, some base is unknown: imported, not a plain one)."""
    seen.add(id(klass))
    inherited = unknown = False
    for name in _base_names(klass):
        base = collected.module_classes.get(name)
        if base is None:
            unknown = unknown or name.rsplit(".", 1)[-1] not in _PLAIN_BASES
            continue
        if id(base) in seen:
            continue
        sets = any(
            method.self_name is not None
            and any(
                type(stmt) is cst.SimpleStatementLine and any(_binds(s, _Target(method.self_name)) for s in stmt.body)
                for stmt in _own_statements(method.node.body)
            )
            for method in base.methods.values()
        )
        deeper, deeper_unknown = _bases(base, collected, seen)
        inherited = inherited or sets or deeper
        unknown = unknown or deeper_unknown
    if len(klass.node.bases) != len(_base_names(klass)):
        unknown = True  # `class A(make_base()):`
    return inherited, unknown


def _is_module(klass: _Class) -> bool:
    return any(name.rsplit(".", 1)[-1] == "Module" for name in _base_names(klass))
