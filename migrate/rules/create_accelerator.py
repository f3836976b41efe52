"""Create the Accelerator where the device is chosen, and bind the device to `accelerator.device`.

What it does:
    Adds `from runtime import Accelerator` (or `from accelerate import Accelerator` with
    `--target accelerate`) and `accelerator = Accelerator()` in the place the script chose its
    device: `device = torch.device("cuda" if torch.cuda.is_available() else "cpu")` and its
    variants (`"cuda"`, `torch.device("cuda:0")`, an `if torch.cuda.is_available():` block,
    `torch.accelerator.current_accelerator()`) become
    `accelerator = Accelerator()` + `device = accelerator.device`. Without a device choice the
    Accelerator is created at the top of the function that builds the optimizer (or after the
    imports for a module-level loop). Helpers of this file that now use `accelerator` receive it
    as a new trailing parameter, and their call sites in this file pass it.

Why:
    One Accelerator per process owns the device, the process group and the precision; the rest of
    the migration calls it.

Example:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ->
    accelerator = Accelerator()
    device = accelerator.device

Leaves alone:
    Files that already create an Accelerator (only missing parameters are threaded), files with no
    training step, and device choices inside loops.

Fix safety:
    Safe: the device name is kept, so `torch.zeros(..., device=device)` still lands on the right
    device for each process.
"""

from __future__ import annotations

import libcst as cst

from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import statement

CODE = "AM001"
NAME = "create-accelerator"

TARGET_MODULES = {"runtime": "runtime", "accelerate": "accelerate"}


def apply(roles: Roles, plan: EditPlan) -> None:
    if not plan.uses_accelerator:
        return
    if not roles.accelerator_exists:
        _create(roles, plan, plan.target)
    _thread_parameter(roles, plan)


def _create(roles: Roles, plan: EditPlan, target: str) -> None:
    kwargs = ", ".join(f"{name}={value}" for name, value in plan.accelerator_kwargs.items())
    create = statement(f"accelerator = Accelerator({kwargs})\n")
    binding = roles.device_binding
    if plan.create_at is not None:
        # The process group was initialised here (AM007): the Accelerator takes its place.
        original = plan.create_at
        plan.replace_stmt[original] = [create.with_changes(leading_lines=original.leading_lines)]
        if binding is not None:
            device = binding.where.stmt
            new_device = statement(f"{binding.name} = accelerator.device\n")
            if isinstance(device, cst.SimpleStatementLine):
                new_device = new_device.with_changes(
                    leading_lines=device.leading_lines, trailing_whitespace=device.trailing_whitespace
                )
            plan.replace_stmt[device] = [new_device]
            plan.rebound[new_device] = binding.name
        anchor: cst.CSTNode = original
        message = "created the Accelerator where the process group was initialised"
    elif binding is not None:
        original = binding.where.stmt
        device = statement(f"{binding.name} = accelerator.device\n")
        if isinstance(original, cst.SimpleStatementLine):
            device = device.with_changes(trailing_whitespace=original.trailing_whitespace)
        plan.replace_stmt[original] = [create.with_changes(leading_lines=original.leading_lines), device]
        plan.rebound[device] = binding.name
        anchor = original
        message = f"`{binding.name}` is now `accelerator.device`"
    else:
        anchor = roles.create_before  # type: ignore[assignment]
        if anchor is None:
            return
        plan.insert_before[anchor] = [create, *plan.insert_before.get(anchor, [])]  # type: ignore[index]
        message = "created the Accelerator"
    for later in roles.later_device_bindings:
        stmt = later.where.stmt
        rebound = statement(f"{later.name} = accelerator.device\n").with_changes(leading_lines=stmt.leading_lines)
        plan.replace_stmt[stmt] = [rebound]
        plan.change(CODE, stmt, f"`{later.name}` chosen again: now `accelerator.device` as well")
    plan.imports.add((TARGET_MODULES[target], "Accelerator"))
    plan.change(CODE, anchor, message)


def _thread_parameter(roles: Roles, plan: EditPlan) -> None:
    """Give every function that now uses `accelerator` (and its callers, as needed) a parameter."""
    threaded: set[int] = set()
    for scope in [*plan.uses_accelerator, roles.accelerator_scope]:
        # Methods reach it as `self.accelerator` (created in a method, or stored by `__init__`).
        if scope is not None and scope.is_method and isinstance(scope.node, cst.FunctionDef):
            plan.self_accelerator.add(scope.node)
    pending = [s for s in plan.uses_accelerator if roles.needs_parameter(s)]
    while pending:
        scope = pending.pop()
        if scope.is_method:
            constructor = roles.constructor_of(scope)
            if constructor is None:
                continue
            # A method that builds an instance (`return Runner(self.model)`) passes `self.accelerator`.
            if isinstance(scope.node, cst.FunctionDef):
                plan.self_accelerator.add(scope.node)
            scope = constructor
            assert isinstance(scope.node, cst.FunctionDef)
            plan.self_accelerator.add(scope.node)
            plan.stores_accelerator.add(scope.node)
        if id(scope) in threaded:
            continue
        threaded.add(id(scope))
        if "accelerator" in scope.params:
            continue
        assert isinstance(scope.node, cst.FunctionDef)
        keyword_only = not scope.simple_signature
        plan.new_params[scope.node] = keyword_only
        plan.change(CODE, scope.node, f"`{scope.name}` takes `accelerator` as a new parameter")
        for caller, call in roles.call_sites(scope):
            plan.new_args[call] = keyword_only or _has_keywords(call)
            if roles.needs_parameter(caller):
                pending.append(caller)


def _has_keywords(call: cst.Call) -> bool:
    return any(arg.keyword is not None or arg.star == "**" for arg in call.args)


