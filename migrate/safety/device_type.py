"""A name that was a string device stays a string where it is used as one (AM102, device-type-kept).

What it checks:
    A name bound only to strings in the input (`device = "cuda" if torch.cuda.is_available() else
    "cpu"`, `"cuda"`, an f-string, `torch.device(...).type`, an `if` whose branches assign such
    strings), in a function or at module level, and rebound in the output to a device object
    (`accelerator.device`, `torch.device(...)`), must not be used in a way only a string supports:
    `"cuda" in device`, `device == "cuda"` (so also `pin_memory=device == "cuda"`),
    `torch.autocast(device_type=device)` or `torch.autocast(device)`, string methods
    (`device.startswith("cuda")`), formatting and concatenation (`f"{device}"`,
    `"run-" + device`), dictionary keys and subscripts (`{device: ...}`, `table[device]`) and
    `isinstance(device, str)`. A parameter counts as the name its callers pass: `train(device)`
    with a string `device` in every caller of the input, and a device object in one of the output.
    Cheap on purpose: a report needs a name bound only to strings in the input and one bound to a
    device object in the output (in the scope or in a caller passing it), both read from the
    statements alone; when the input binds no name only to strings or the output binds none to a
    device object, the expressions are not walked for uses and calls (tests/migrate/
    test_safety_shortcuts.py compares the verdicts with and without this on every fixture).

Why:
    A `torch.device` is not a string: `"cuda" in torch.device("cuda")` raises TypeError,
    `torch.device("cpu") == "cpu"` is False, `torch.autocast(device_type=torch.device(...))` raises,
    and `f"{torch.device('cuda', 1)}"` is `cuda:1`, not `cuda`. Each of these silently changes
    what the script does (pinned memory off, the CUDA branch never taken) or crashes it.

What it cannot see:
    Strings that flow through containers, attributes (`self.device`), return values or another
    module, and callers that pass the device by an expression rather than a name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate.safety import CheckContext, Violation
from migrate.safety.accelerator_bound import line_of
from migrate.names import call_argument
from migrate.walk import children, statement_blocks

CODE = "AM102"
NAME = "device-type-kept"

_STRING_METHODS = frozenset({
    "startswith", "endswith", "split", "rsplit", "lower", "upper", "replace", "strip", "format", "join",
    "find", "partition", "rpartition", "encode", "casefold", "isdigit",
})


def check(context: CheckContext) -> list[Violation]:
    # A violation needs a name bound only to strings in the input (`_string_origin`: values all
    # strings, here or in the callers passing it) and bound to a device object in the output
    # (`_device_origin`: a value here or in a caller). Both are bindings, read from the statements
    # without walking any expression: when either module has none, nothing can be reported, and
    # the walks for uses and calls (most of this check's cost) are skipped.
    before = _Module(context.before)
    if not before.binds_strings():
        return []
    after = _Module(context.after)
    if not after.binds_devices():
        return []
    after.walk()
    # names used as strings that the output binds to a device object; the input is walked only
    # when there is one (most outputs have none, and the walk of the input costs as much again)
    suspects = [(qualname, scope, name, now) for qualname, scope in after.scopes.items()
                for name in sorted(set(scope.uses)) if (now := _device_origin(after, scope, name)) is not None]
    if not suspects:
        return []
    before.walk()
    positions = line_of(context)
    violations: list[Violation] = []
    for qualname, scope, name, now in suspects:
        old = before.scopes.get(qualname)
        if old is not None:
            was = _string_origin(before, old, name)
            if was is None:
                continue
            for use, what in scope.uses[name]:
                violations.append(Violation(positions(use), (
                    f"`{name}` was a string in the input (`{was}`) and is now a torch.device (`{now}`), "
                    f"but {what} needs a string (a torch.device is not one: `in` raises, `==` against a "
                    f"string is False, autocast rejects it); bind `{name} = accelerator.device.type` instead"
                )))
    return sorted(violations, key=lambda v: v.line)


@dataclass(eq=False)
class _Scope:
    node: cst.Module | cst.FunctionDef
    params: list[str] = field(default_factory=list)
    values: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)  # name -> assigned values
    uses: dict[str, list[tuple[cst.CSTNode, str]]] = field(default_factory=dict)  # string-only uses
    calls: list[tuple[str, cst.Call]] = field(default_factory=list)  # plain-name calls
    statements: list[object] = field(default_factory=list)  # its own statements and headers, walked for uses


class _Module:
    """A module's scopes. Made with the bindings of each scope (`values`, `params`: read from the
    statements alone); `walk` adds the uses and calls (a walk of every expression)."""

    def __init__(self, module: cst.Module) -> None:
        self.scopes: dict[str, _Scope] = {}
        self.functions: dict[str, str] = {}  # module-level function name -> qualname
        self._scan(module.body, _Scope(module), "", top=True)
        self.code = module.code_for_node
        self._walked = False

    def walk(self) -> None:
        """Record every scope's string-only uses and plain-name calls (once)."""
        if self._walked:
            return
        self._walked = True
        for scope in self.scopes.values():
            uses = _Uses(scope)
            for stmt in scope.statements:
                uses.collect(stmt)

    def binds_strings(self) -> bool:
        """Some name of some scope is bound, and only to strings (what `_string_origin` needs,
        in the scope itself or in a caller passing it)."""
        return any(name not in scope.params and all(_stringy(v) for v in values)
                   for scope in self.scopes.values() for name, values in scope.values.items())

    def binds_devices(self) -> bool:
        """Some name of some scope is bound to a device object (what `_device_origin` needs, in
        the scope itself or in a caller passing it)."""
        return any(_device_object(v) for scope in self.scopes.values() for values in scope.values.values()
                   for v in values)

    def _scan(self, stmts: Sequence[cst.BaseStatement], scope: _Scope, qualname: str, top: bool) -> None:
        self.scopes.setdefault(qualname or "<module>", scope)
        for stmt in _statements(stmts):
            if type(stmt) is cst.FunctionDef:
                name = f"{qualname}.{stmt.name.value}" if qualname else stmt.name.value
                params = stmt.params
                inner = _Scope(stmt, params=[p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)])
                if top:
                    self.functions[stmt.name.value] = name
                body = stmt.body.body if type(stmt.body) is cst.IndentedBlock else ()
                self._scan(body, inner, name, top=False)
            elif type(stmt) is cst.ClassDef:
                body = stmt.body.body if type(stmt.body) is cst.IndentedBlock else ()
                self._scan_class(body, f"{qualname}.{stmt.name.value}" if qualname else stmt.name.value)
            else:
                scope.statements.append(stmt)
                if type(stmt) is cst.SimpleStatementLine:
                    for small in stmt.body:
                        if type(small) is cst.Assign and len(small.targets) == 1 and type(small.targets[0].target) is cst.Name:
                            scope.values.setdefault(small.targets[0].target.value, []).append(small.value)
                        elif type(small) is cst.AnnAssign and type(small.target) is cst.Name and small.value is not None:
                            scope.values.setdefault(small.target.value, []).append(small.value)

    def _scan_class(self, stmts: Sequence[cst.BaseStatement], qualname: str) -> None:
        for stmt in _statements(stmts):
            if type(stmt) is cst.FunctionDef:
                params = stmt.params
                inner = _Scope(stmt, params=[p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)])
                body = stmt.body.body if type(stmt.body) is cst.IndentedBlock else ()
                self._scan(body, inner, f"{qualname}.{stmt.name.value}", top=False)


def _statements(stmts: Sequence[cst.BaseStatement]) -> Iterable[cst.BaseStatement]:
    """Statements of a block with the blocks of compound statements flattened in (defs kept whole)."""
    for stmt in stmts:
        if type(stmt) in (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef):
            yield stmt
            continue
        yield _HeaderOnly(stmt)  # type: ignore[misc]
        for block in statement_blocks(stmt):
            yield from _statements(block)


class _HeaderOnly:
    """A compound statement seen without its blocks (its test, iterable, items...)."""

    def __init__(self, stmt: cst.BaseStatement) -> None:
        self.stmt = stmt


def _header_parts(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    if type(stmt) is cst.If:
        parts: list[cst.CSTNode] = []
        branch: object = stmt
        while type(branch) is cst.If:
            parts.append(branch.test)
            branch = branch.orelse
        return parts
    if type(stmt) is cst.For:
        return [stmt.iter]
    if type(stmt) is cst.While:
        return [stmt.test]
    if type(stmt) is cst.With:
        return [item.item for item in stmt.items]
    if type(stmt) is cst.Match:
        return [stmt.subject]
    return []


class _Uses:
    """Records a scope's string-only uses of plain names and its plain-name calls."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope

    def collect(self, stmt: object) -> None:
        if isinstance(stmt, _HeaderOnly):
            for part in _header_parts(stmt.stmt):
                self._walk(part)
            return
        assert type(stmt) is cst.SimpleStatementLine
        for small in stmt.body:
            self._walk(small)

    def _use(self, node: cst.CSTNode, name: str, what: str) -> None:
        self.scope.uses.setdefault(name, []).append((node, what))

    def _walk(self, node: cst.CSTNode) -> None:
        if type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            return
        if type(node) is cst.Comparison:
            self._comparison(node)
        elif type(node) is cst.Arg:
            if node.keyword is not None and node.keyword.value == "device_type" and type(node.value) is cst.Name:
                self._use(node, node.value.value, "`device_type=`")
        elif type(node) is cst.Call:
            self._call(node)
        elif type(node) is cst.FormattedStringExpression and type(node.expression) is cst.Name:
            self._use(node, node.expression.value, "formatting it into a string")
        elif type(node) is cst.BinaryOperation:
            self._binary(node)
        elif type(node) is cst.Dict:
            for element in node.elements:
                if type(element) is cst.DictElement and type(element.key) is cst.Name:
                    self._use(element, element.key.value, "a dictionary key")
        elif type(node) is cst.Subscript and len(node.slice) == 1:
            index = node.slice[0].slice
            if type(index) is cst.Index and type(index.value) is cst.Name:
                self._use(node, index.value.value, "a lookup by key")
        for child in children(node):
            self._walk(child)

    def _comparison(self, node: cst.Comparison) -> None:
        left = node.left
        for target in node.comparisons:
            right = target.comparator
            op = target.operator
            if type(op) in (cst.In, cst.NotIn) and type(right) is cst.Name:
                self._use(node, right.value, "`in`")
            elif type(op) in (cst.Equal, cst.NotEqual):
                for one, other in ((left, right), (right, left)):
                    if type(one) is cst.Name and _is_string(other):
                        self._use(node, one.value, "`==` against a string")
            left = right

    def _call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Name:
            self.scope.calls.append((func.value, node))
            if func.value == "isinstance" and len(node.args) == 2 and type(node.args[0].value) is cst.Name:
                if type(node.args[1].value) is cst.Name and node.args[1].value.value == "str":
                    self._use(node, node.args[0].value.value, "`isinstance(..., str)`")
        if type(func) is cst.Attribute:
            if func.attr.value in _STRING_METHODS and type(func.value) is cst.Name:
                self._use(node, func.value.value, f"`.{func.attr.value}()`")
        attr = func.attr.value if type(func) is cst.Attribute else getattr(func, "value", "")
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if attr == "autocast" and positional and type(positional[0].value) is cst.Name:
            self._use(node, positional[0].value.value, "autocast's `device_type`")

    def _binary(self, node: cst.BinaryOperation) -> None:
        if type(node.operator) is cst.Add:
            for one, other in ((node.left, node.right), (node.right, node.left)):
                if type(one) is cst.Name and _is_string(other):
                    self._use(node, one.value, "string concatenation")
        elif type(node.operator) is cst.Modulo and _is_string(node.left):
            values = [e.value for e in node.right.elements] if type(node.right) is cst.Tuple else [node.right]
            for value in values:
                if type(value) is cst.Name:
                    self._use(node, value.value, "`%` formatting")


def _is_string(expr: cst.BaseExpression) -> bool:
    return type(expr) in (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


def _stringy(expr: cst.BaseExpression) -> bool:
    """An expression whose value is a str whatever runs: literals, f-strings, `x.type`, `str(x)`."""
    if _is_string(expr):
        return True
    if type(expr) is cst.IfExp:
        return _stringy(expr.body) and _stringy(expr.orelse)
    if type(expr) is cst.Attribute:
        return expr.attr.value == "type"  # `torch.device(...).type`, `accelerator.device.type`
    if type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Name and func.value == "str":
            return True
        return type(func) is cst.Attribute and _is_string(func.value) and func.attr.value in ("format", "join")
    if type(expr) is cst.BinaryOperation and type(expr.operator) in (cst.Add, cst.Modulo):
        return _is_string(expr.left)
    return False


def _device_object(expr: cst.BaseExpression) -> bool:
    """`accelerator.device`, `self.accelerator.device`, `torch.device(...)`."""
    if type(expr) is cst.Attribute:
        return expr.attr.value == "device"
    if type(expr) is cst.Call and type(expr.func) is cst.Attribute:
        return expr.func.attr.value == "device"
    return False


def _string_origin(module: _Module, scope: _Scope, name: str, depth: int = 0) -> str | None:
    """The code of the string `name` was bound to in `scope` of the input (None: not a string)."""
    values = scope.values.get(name)
    if values:
        if name in scope.params or not all(_stringy(v) for v in values):
            return None
        return module.code(values[0])
    if name in scope.params and depth == 0:
        passed = _passed(module, scope, name)
        if passed and all(_string_origin(module, caller, arg, 1) is not None for caller, arg in passed):
            caller, arg = passed[0]
            return _string_origin(module, caller, arg, 1)
    return None


def _device_origin(module: _Module, scope: _Scope, name: str, depth: int = 0) -> str | None:
    """The code of a device object `name` is bound to in `scope` of the output (None: none)."""
    for value in scope.values.get(name, []):
        if _device_object(value):
            return module.code(value)
    if name in scope.params and depth == 0 and not scope.values.get(name):
        for caller, arg in _passed(module, scope, name):
            found = _device_origin(module, caller, arg, 1)
            if found is not None:
                return found
    return None


def _passed(module: _Module, scope: _Scope, name: str) -> list[tuple[_Scope, str]]:
    """(caller scope, argument name) for each call of this module-level function that passes
    `name` by a plain name; empty when any caller passes something else or nothing is found."""
    if type(scope.node) is not cst.FunctionDef:
        return []
    qualname = module.functions.get(scope.node.name.value)
    if qualname is None or module.scopes.get(qualname) is not scope:
        return []
    index = scope.params.index(name)
    out: list[tuple[_Scope, str]] = []
    for caller in module.scopes.values():
        for callee, call in caller.calls:
            if callee != scope.node.name.value:
                continue
            arg = call_argument(call, index, name)
            if type(arg) is not cst.Name:
                return []
            out.append((caller, arg.value))
    return out


def used_as_string(module: cst.Module, scope_node: cst.Module | cst.FunctionDef, name: str) -> bool:
    """True when `name` in the scope of `scope_node` is used in a way only a string supports, there
    or in a same-module function it is passed to by name (what create-accelerator asks before
    binding a string device to `accelerator.device`)."""
    scanned = _Module(module)
    scanned.walk()
    scope = next((s for s in scanned.scopes.values() if s.node is scope_node), None)
    if scope is None:
        return False
    if scope.uses.get(name):
        return True
    for callee, call in scope.calls:
        qualname = scanned.functions.get(callee)
        target = scanned.scopes.get(qualname) if qualname is not None else None
        if target is None:
            continue
        for index, param in enumerate(target.params):
            arg = call_argument(call, index, param)
            if type(arg) is cst.Name and arg.value == name and target.uses.get(param) and not target.values.get(param):
                return True
    return False
