"""Which function a package's dispatching wrapper runs for the calls one script makes of it.

swin's `data/__init__.py` does not re-export the loader builder, it wraps it:

    from .build import build_loader as _build_loader

    def build_loader(config, simmim=False, is_pretrain=False):
        if not simmim:
            return _build_loader(config)
        ...

and `main.py` calls `build_loader(config)`. For that call the wrapper is `_build_loader(config)`:
the branch taken is decided by parameters the call leaves at their literal defaults (or passes as
literals), and the branch hands its arguments on unchanged, in order. The module index
(`migrate/project.py`) then records the name as imported from the module defining `_build_loader`,
so that the cross-module analysis follows the loaders it builds.

Only this shape is followed: a top-level `def` without decorators, `*args` or `**kwargs`, whose
body (after a docstring) is `if`/`else` chains over literal-valued parameters (`not p`, `p`,
`p == 1`, `p is None`, `and`, `or`) ending in `return g(a, b, ...)` where `a, b, ...` are the
wrapper's first parameters, each call of the script passing exactly those positionally (any other
parameter as a literal keyword), and the script using the name only to call it. Anything else
(a branch on a value the call does not fix, a statement before the return, a call passing its
arguments on reordered or changed) is not followed, and the unit's AM013 diagnostic says so.
"""

from __future__ import annotations

import ast
from functools import lru_cache

_UNKNOWN = object()


# A pure function of its texts, asked again by each index of a run that holds the script (the run's,
# its unit's, the unit's second run): answered once.
@lru_cache(maxsize=64)
def forwarded(package_text: str, name: str, importer_text: str, local: str) -> str | None:
    """The name, bound in the package module, that every call of `local` in the importer runs
    through the package's function `name`; None when the wrapper is not this plain dispatch."""
    try:
        package, importer = ast.parse(package_text), ast.parse(importer_text)
    except SyntaxError:
        return None
    defs = [n for n in package.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(defs) != 1 or defs[0].decorator_list or not _plain_signature(defs[0].args):
        return None
    calls = _calls(importer, local)
    if not calls:
        return None
    targets = {_target(defs[0], call) for call in calls}
    if len(targets) != 1:
        return None
    return targets.pop()


def _plain_signature(args: ast.arguments) -> bool:
    return not (args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs)


def _calls(tree: ast.Module, local: str) -> list[ast.Call] | None:
    """Every call of `local` in the importer, or None when the name is also used otherwise."""
    calls: list[ast.Call] = []
    called: set[int] = set()
    # ast.walk yields a node before its children: a call is seen before the name it calls
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == local:
            calls.append(node)
            called.add(id(node.func))
        elif isinstance(node, ast.Name) and node.id == local and id(node) not in called:
            return None  # passed around, rebound or deleted: not only called
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == local:
            return None
    return calls


def _target(function: ast.FunctionDef, call: ast.Call) -> str | None:
    params = [a.arg for a in function.args.args]
    defaults = function.args.defaults
    values: dict[str, object] = {p: _UNKNOWN for p in params}
    for param, default in zip(params[len(params) - len(defaults):], defaults):
        values[param] = default.value if isinstance(default, ast.Constant) else _UNKNOWN
    if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(params):
        return None
    passed = params[: len(call.args)]
    for param in passed:
        values[param] = _UNKNOWN  # whatever the script passes: only handed on
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in values or keyword.arg in passed:
            return None
        if not isinstance(keyword.value, ast.Constant):
            return None  # a keyword decides a branch only as a literal
        values[keyword.arg] = keyword.value.value
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return _returned(body, values, passed)


def _returned(body: list[ast.stmt], values: dict[str, object], passed: list[str]) -> str | None:
    for statement in body:
        if isinstance(statement, ast.If):
            decided = _evaluate(statement.test, values)
            if decided is _UNKNOWN:
                return None
            branch = statement.body if decided else statement.orelse
            if branch:
                return _returned(branch, values, passed)
            continue  # a false `if` without else: on to the next statement
        if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Call):
            call = statement.value
            handed = [a.id if isinstance(a, ast.Name) else None for a in call.args]
            if isinstance(call.func, ast.Name) and not call.keywords and handed == passed:
                return call.func.id
        return None
    return None


def _evaluate(test: ast.expr, values: dict[str, object]) -> object:
    """The truth of `test` from the parameters' literal values, or _UNKNOWN."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Name):
        value = values.get(test.id, _UNKNOWN)
        return _UNKNOWN if value is _UNKNOWN else bool(value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _evaluate(test.operand, values)
        return _UNKNOWN if inner is _UNKNOWN else not inner
    if isinstance(test, ast.BoolOp):
        results = [_evaluate(v, values) for v in test.values]
        if _UNKNOWN in results:
            return _UNKNOWN
        return all(results) if isinstance(test.op, ast.And) else any(results)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = _value(test.left, values), _value(test.comparators[0], values)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        op = test.ops[0]
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.Is):
            return left is right
        if isinstance(op, ast.IsNot):
            return left is not right
    return _UNKNOWN


def _value(node: ast.expr, values: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values.get(node.id, _UNKNOWN)
    return _UNKNOWN
