"""Whether the file is a training script at all, before any rule rewrites it.

A test module, a library module (no entry point, no DataLoader: its models and data come from its
caller) and a file whose optimizer or Accelerator is created in a class body are refused here with
the reason (AM004 / AM001): no placement of the Accelerator would be right for them.
`training_functions` finds the functions that call backward, directly or through others."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Facts, Scope
from migrate.names import dotted_name
from migrate.roles.calls import DATALOADER
from migrate.roles.model import ACCELERATOR, PREPARE, Finding, Roles, transitive_callers


def training_functions(roles: Roles) -> set[Scope]:
    """The functions (and methods) that call backward, directly or through others they call
    (a callable object's `__call__` included, see `Roles.runs`), or that call an object the
    migration cannot read that runs the backward and the step (`Roles.hidden_steps`)."""
    units = [s for s in roles.facts.scopes if s.is_function]
    hidden = {id(scope) for scope, _ in roles.hidden_steps}
    return transitive_callers(units, {scope for scope in units if scope.backwards or id(scope) in hidden}, roles.runs)


def is_library_module(roles: Roles) -> bool:
    """A test module, or a module that trains nothing by itself, is reported and left as it is.

    A test module (it imports `unittest` or `pytest`, or defines a `...TestCase` class) exercises
    training code; it is not a training script. A library module has no entry point (no
    `if __name__ == "__main__":` guard, and no module-level code that reaches the function building
    the optimizer through this file's own calls), builds no DataLoader and has no training loop over
    a loader: its models and data are handed in by whoever imports it (a numerical-check helper, a
    test harness), so an Accelerator created in it would own nothing. A script has an entry point; a
    `def main()` excerpt builds its own DataLoader; a trainer class iterates the loader it is given.
    """
    home = roles.home
    assert home is not None
    facts = roles.facts
    if _is_test_module(facts):
        reason = (
            "this is a test module (it imports unittest or pytest, or defines a TestCase): its training "
            "code is a test of training, not a training script, so it was left as it is"
        )
    elif (
        _has_main_guard(facts.module)
        or _runs_from_module_level(roles, home)
        or roles.loaders
        or any(call.qualified in DATALOADER for scope in facts.scopes for call in scope.library_calls)
    ):
        return False
    else:
        reason = (
            "this module builds an optimizer but has no entry point (`if __name__ == \"__main__\":` or "
            "module-level code that trains) and no DataLoader feeds its training: it looks like a library "
            "module whose models and data come from its caller, so it was left as it is; migrate the script "
            "that builds them"
        )
    binding = home.bindings[roles.optimizers[0]][0] if roles.optimizers else None
    roles.refused = True
    roles.findings = [Finding(PREPARE, binding.where.stmt if binding is not None else home.node, reason)]
    return True


_TEST_FRAMEWORKS = ("unittest", "pytest")


def _is_test_module(facts: Facts) -> bool:
    """The module imports unittest or pytest at its top level, or defines a class derived from a
    base named `...TestCase` (unittest's TestCase and the harnesses built on it)."""
    for stmt in facts.module.body:
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            if type(small) is cst.Import:
                modules = [dotted_name(alias.name) or "" for alias in small.names]
            elif type(small) is cst.ImportFrom and not small.relative and small.module is not None:
                modules = [dotted_name(small.module) or ""]
            else:
                continue
            if any(m.split(".", 1)[0] in _TEST_FRAMEWORKS for m in modules):
                return True
    for owner in facts.classes.values():
        assert type(owner.node) is cst.ClassDef
        for base in owner.node.bases:
            name = dotted_name(base.value)
            if name is not None and name.rsplit(".", 1)[-1].endswith("TestCase"):
                return True
    return False


def _has_main_guard(module: cst.Module) -> bool:
    """`if __name__ == "__main__":` (either operand order) among the module's top-level statements."""
    for stmt in module.body:
        if not (type(stmt) is cst.If and type(stmt.test) is cst.Comparison):
            continue
        test = stmt.test
        if len(test.comparisons) != 1 or type(test.comparisons[0].operator) is not cst.Equal:
            continue
        operands = (test.left, test.comparisons[0].comparator)
        if any(type(o) is cst.Name and o.value == "__name__" for o in operands) and any(
            type(o) is cst.SimpleString and o.evaluated_value == "__main__" for o in operands
        ):
            return True
    return False


def _runs_from_module_level(roles: Roles, target: Scope) -> bool:
    """True when module-level code reaches `target` through calls of this file's functions,
    classes (any method of a class it instantiates) and sibling methods (`self.step()`)."""
    facts = roles.facts
    seen: set[int] = set()
    pending = [facts.module_scope]
    while pending:
        scope = pending.pop()
        if scope is target:
            return True
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        for site in scope.calls:
            function = facts.resolve(site.callee, scope)
            if function is not None:
                pending.append(function)
            owner = facts.classes.get(site.callee)
            if owner is not None:
                pending.extend(s for s in facts.scopes if s.parent is owner and s.is_function)
            if site.callee.startswith("self.") and scope.is_method:
                pending.extend(roles.methods_of(scope) or [])
    return False


def built_in_a_class_body(roles: Roles) -> bool:
    """An optimizer or an Accelerator created in a class body refuses a file that trains.

    A class body runs once, when the class is defined, and its names are class attributes that
    neither its methods nor the module's functions can read by their plain name: an `accelerator`
    created there is out of reach of every function that would use it, and a `prepare(...)` there
    would rebind attributes the methods read through `self` or the class. No placement is right
    for every such shape, so the file is reported and left as it is.
    """
    home, scope = roles.home, roles.accelerator_scope
    if scope is not None and type(scope.node) is cst.ClassDef:
        binding = scope.accelerators[0]
        finding = Finding(
            ACCELERATOR,
            binding.where.stmt,
            f"the Accelerator is created in the body of class `{scope.name}`, where the functions and "
            "methods of this file cannot read it as `accelerator`, so the file was left as it is: create it "
            "in the function that trains (or at module level) and run accel-migrate again", unconverted=True,
        )
    elif home is not None and type(home.node) is cst.ClassDef:
        binding = home.bindings[roles.optimizers[0]][0]
        finding = Finding(
            PREPARE,
            binding.where.stmt,
            f"the optimizer `{binding.name}` is built in the body of class `{home.name}`, which runs once "
            "when the class is defined and whose names its methods cannot read, so `accelerator.prepare(...)` "
            "has no safe place and the file was left as it is: build the training objects in a function "
            "(or in `__init__` as `self.` attributes) and run accel-migrate again", unconverted=True,
        )
    else:
        return False
    roles.refused = True
    roles.findings = [finding]
    return True
